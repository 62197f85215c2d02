//! Encoding a (query, document) pair for cross-encoders (rerankers).

use crate::error::{Result, TokenizerError};
use crate::vocab::{VocabKind, KEY_BOS, KEY_EOS, KEY_SEP};
use crate::Tokenizer;

fn need(id: Option<u32>, what: &'static str, key: &'static str) -> Result<u32> {
    id.ok_or(TokenizerError::MissingToken { what, key })
}

impl Tokenizer {
    /// The ids and token type ids of a (query, document) pair for a cross-encoder.
    ///
    /// Query and document are each tokenized as `encode(text, false, false)` (special-token
    /// text is literal, as in llama-server's `format_prompt_rerank`, which tokenizes both
    /// with `tokenize_input_subprompt(.., add_special = false, parse_special = false)`), then
    /// joined the way Hugging Face transformers' tokenizers join a pair:
    ///
    /// * WordPiece (BERT, `BertTokenizer.build_inputs_with_special_tokens`):
    ///   `[CLS] q [SEP] d [SEP]`, type 0 for `[CLS] q [SEP]` and 1 for `d [SEP]`.
    /// * Unigram with BOS (XLM-RoBERTa, `XLMRobertaTokenizer`): `<s> q </s></s> d </s>`;
    ///   without BOS (T5, `T5Tokenizer`): `q </s> d </s>`; all type 0.
    /// * Other vocabularies: llama-server's `format_prompt_rerank` without a rerank
    ///   template: BOS (if the model adds it), `q`, EOS (if it adds EOS; the separator where
    ///   it has no EOS), the separator (if `add_sep`), `d`, EOS again (if it adds EOS); all
    ///   type 0.
    ///
    /// The first two differ from llama-server, which gives `[CLS] q [SEP] d` for BERT (no EOS,
    /// so no closing separator) and `<s> q </s> d </s>` for XLM-RoBERTa unless the file sets
    /// `add_sep_token`; the models were trained on transformers' form.
    ///
    /// Errors: [`TokenizerError::MissingToken`] naming a token the form needs that the
    /// vocabulary lacks; any error of [`Tokenizer::encode`].
    pub fn encode_pair(&self, query: &str, document: &str) -> Result<(Vec<u32>, Vec<u32>)> {
        let q = self.encode(query, false, false)?;
        let d = self.encode(document, false, false)?;
        self.pair_from_ids(&q, &d)
    }

    /// [`Tokenizer::encode_pair`] of a query and a document already tokenized as
    /// `encode(text, false, false)` (a query scored against many documents is tokenized
    /// once).
    ///
    /// Errors: [`TokenizerError::MissingToken`] as [`Tokenizer::encode_pair`].
    pub fn pair_from_ids(&self, q: &[u32], d: &[u32]) -> Result<(Vec<u32>, Vec<u32>)> {
        let sp = &self.vocab.special;
        let mut ids = Vec::with_capacity(q.len() + d.len() + 5);
        let mut first_len = None;
        match self.vocab.kind {
            VocabKind::Wpm => {
                let cls = need(sp.bos, "BOS ([CLS])", KEY_BOS)?;
                let sep = need(sp.sep, "separator ([SEP])", KEY_SEP)?;
                ids.push(cls);
                ids.extend_from_slice(q);
                ids.push(sep);
                first_len = Some(ids.len());
                ids.extend_from_slice(d);
                ids.push(sep);
            }
            VocabKind::Ugm => {
                let eos = need(sp.eos, "EOS", KEY_EOS)?;
                if self.vocab.add_bos {
                    ids.push(need(sp.bos, "BOS", KEY_BOS)?);
                    ids.extend_from_slice(q);
                    ids.extend_from_slice(&[eos, eos]);
                } else {
                    ids.extend_from_slice(q);
                    ids.push(eos);
                }
                ids.extend_from_slice(d);
                ids.push(eos);
            }
            VocabKind::Spm | VocabKind::Bpe | VocabKind::Gemma4 => {
                let v = &self.vocab;
                let end = || need(sp.eos.or(sp.sep), "EOS", KEY_EOS);
                if v.add_bos {
                    ids.push(need(sp.bos, "BOS", KEY_BOS)?);
                }
                ids.extend_from_slice(q);
                if v.add_eos {
                    ids.push(end()?);
                }
                if v.add_sep {
                    ids.push(need(sp.sep, "separator", KEY_SEP)?);
                }
                ids.extend_from_slice(d);
                if v.add_eos {
                    ids.push(end()?);
                }
            }
        }
        let first = first_len.unwrap_or(ids.len());
        let types = (0..ids.len()).map(|i| u32::from(i >= first)).collect();
        Ok((ids, types))
    }
}
