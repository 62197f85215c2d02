//! frink's tokenizer: a GGUF file's `tokenizer.*` metadata turned into a tokenizer that
//! gives the ids llama.cpp gives, streaming detokenization, and chat prompts rendered from
//! the file's own template.
//!
//! * [`Tokenizer::from_gguf`] reads the vocabulary ([`TokenAttr`], [`SpecialTokens`], the
//!   end-of-generation set) and builds a `tokenizers` pipeline: byte-level BPE with the
//!   pre-tokenizer named by `tokenizer.ggml.pre` (`gpt2`), SentencePiece-style BPE over
//!   scores with byte fallback (`llama`), or Gemma 4's BPE (`gemma4`); or frink's own
//!   WordPiece (`bert`, [`VocabKind::Wpm`]) and Unigram (`t5`, [`VocabKind::Ugm`]) for
//!   encoder models. Other families and pre-tokenizers are refused with an error naming them.
//! * [`Tokenizer::encode`] cuts special tokens out first (control tokens only with
//!   `parse_special`, user-defined tokens always) and adds BOS/EOS as the model says.
//! * [`Tokenizer::decode`] and [`StreamDecoder`] render ids back to text.
//! * [`Tokenizer::apply_chat_template`] renders a conversation with minijinja and
//!   [`Tokenizer::encode_chat`] tokenizes it with the scaffolding's special tokens parsed and
//!   every message's content literal.
//!
//! Every rule cites the llama.cpp source it follows (src/llama-vocab.cpp, src/unicode.cpp,
//! src/llama-chat.cpp, common/chat.cpp of the snapshot the golden data was made with).
//!
//! No `unsafe` but one FFI call, glibc's `malloc_trim`, in `release_free_heap`.

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod chat;
mod decode;
mod error;
mod fim;
mod model;
mod pair;
mod partition;
mod pretok;
mod strftime;
mod ugm;
mod unicode;
mod unicode_tables;
mod wpm;

/// `t` (UTC) formatted as Python's `time.strftime` formats it, for the directives chat
/// templates use (`%Y %m %d %H %M %S %b %B %a %A %e %I %j %p %y %w %%`).
///
/// Errors: an unsupported directive, named.
pub fn strftime(fmt: &str, t: std::time::SystemTime) -> std::result::Result<String, String> {
    strftime::format(fmt, t)
}
mod vocab;

use std::ops::Range;
use std::path::Path;

use frink_gguf::GgufFile;

pub use chat::{render_template, ChatMessage, ChatPrompt, TemplateInputs, TemplateSource};
pub use error::{Result, TokenizerError};
pub use fim::{Infill, InfillLimits};
pub use pretok::{PreTokenizer, SUPPORTED as SUPPORTED_PRE_TOKENIZERS};
pub use vocab::{SpecialTokens, TokenAttr, VocabKind};

use decode::{drain_utf8, Pieces, SpaceCleaner};
use partition::{Fragment, Partitioner};
use vocab::Vocab;

/// What tokenizes the raw text between special tokens.
enum Engine {
    /// A `tokenizers` pipeline (BPE, SentencePiece, Gemma 4).
    Hf(Box<tokenizers::Tokenizer>),
    /// WordPiece.
    Wpm(wpm::Wpm),
    /// Unigram.
    Ugm(ugm::Ugm),
}

/// The per-token metadata arrays a tokenizer is built from (GGUF's `tokenizer.ggml.*`
/// names): what [`Tokenizer::from_gguf_releasing`] frees.
pub const VOCAB_ARRAY_KEYS: [&str; 4] = [
    vocab::KEY_TOKENS,
    vocab::KEY_SCORES,
    vocab::KEY_TYPES,
    vocab::KEY_MERGES,
];

/// Returns the heap's free pages to the OS (glibc `malloc_trim(0)`); elsewhere a no-op.
#[allow(unsafe_code)]
fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointers and touches only glibc's own free lists (it
    // locks each arena, so other threads may allocate meanwhile); no Rust invariant is
    // involved. There is no safe twin to compare against: it changes no value, only RSS.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A model's tokenizer, built from its GGUF metadata.
///
/// Cheap to share by reference across threads (`Send + Sync`); building it is the costly
/// part (for a 262k-token SentencePiece vocabulary, deriving the merges takes about a second).
pub struct Tokenizer {
    vocab: Vocab,
    engine: Engine,
    partitioner: Partitioner,
    pieces: Pieces,
    architecture: String,
    chat_template: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.vocab.kind)
            .field("pre", &self.vocab.pre)
            .field("n_vocab", &self.vocab.n_tokens())
            .field("special", &self.vocab.special)
            .field("add_bos", &self.vocab.add_bos)
            .field("add_eos", &self.vocab.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer of the GGUF file at `path` (metadata only; tensors are not read).
    ///
    /// Errors: the file cannot be opened or parsed, or any error of [`Tokenizer::from_gguf`].
    pub fn from_path(path: impl AsRef<Path>) -> Result<Tokenizer> {
        Tokenizer::from_gguf(&GgufFile::open(path)?)
    }

    /// Builds the tokenizer described by `file`'s `tokenizer.*` metadata.
    ///
    /// Errors: [`TokenizerError::UnsupportedModel`] / [`TokenizerError::UnsupportedPreTokenizer`]
    /// naming an unimplemented `tokenizer.ggml.model` / `pre`; [`TokenizerError::MissingKey`],
    /// [`TokenizerError::BadValue`], [`TokenizerError::DuplicateToken`],
    /// [`TokenizerError::BadMerge`], [`TokenizerError::MissingSpecialToken`] for a malformed
    /// vocabulary ([`TokenizerError::BadValue`] on `tokenizer.ggml.precompiled_charsmap` for
    /// a damaged Unigram character map).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let mut vocab = Vocab::load(file)?;
        let engine = match vocab.kind {
            VocabKind::Wpm => Engine::Wpm(wpm::Wpm::new(&vocab)),
            VocabKind::Ugm => {
                let type_attrs = std::mem::take(&mut vocab.type_attrs);
                Engine::Ugm(ugm::Ugm::new(&vocab, &type_attrs)?)
            }
            VocabKind::Spm | VocabKind::Bpe | VocabKind::Gemma4 => {
                let hf = model::build(&vocab)?;
                // `tokenizers` keeps its own text -> id map: ours was for building.
                vocab.text_to_id = Default::default();
                Engine::Hf(Box::new(hf))
            }
        };
        let partitioner = Partitioner::new(&vocab)?;
        let pieces = Pieces::new(&vocab);
        vocab.merges = Vec::new();
        vocab.charsmap = Vec::new();
        let chat_template = match file.get("tokenizer.chat_template") {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or(TokenizerError::BadValue {
                        key: "tokenizer.chat_template",
                        what: format!("expected a string, found {v}"),
                    })?
                    .to_string(),
            ),
        };
        Ok(Tokenizer {
            vocab,
            engine,
            partitioner,
            pieces,
            architecture: file.architecture().unwrap_or("").to_string(),
            chat_template,
        })
    }

    /// [`Tokenizer::from_gguf`], then removes from `file` the vocabulary arrays it consumed
    /// ([`VOCAB_ARRAY_KEYS`]), for callers that keep the file only for its tensors: they are
    /// the largest metadata (about 20 MB of parsed strings for a 262k-token vocabulary) and
    /// the tokenizer holds what it needs of them. The heap freed by the build (the derived
    /// SentencePiece merges as strings: about 40 MB for Gemma 3's vocabulary) is returned to
    /// the OS, where the allocator allows (glibc), so it does not stay in the process's
    /// resident memory next to the weights. Building a second tokenizer from `file`
    /// afterwards fails with [`TokenizerError::MissingKey`].
    pub fn from_gguf_releasing(file: &mut GgufFile) -> Result<Tokenizer> {
        let tok = Tokenizer::from_gguf(file)?;
        for key in VOCAB_ARRAY_KEYS {
            file.remove_metadata(key);
        }
        release_free_heap();
        Ok(tok)
    }

    /// Tokenizes `text` as `llama_tokenize(text, add_special, parse_special)` does.
    ///
    /// `add_special` adds BOS (and EOS) where the model's `add_bos_token` (`add_eos_token`)
    /// says so; `parse_special` lets the text of control tokens (e.g. `<|im_start|>`) become
    /// those tokens, otherwise it is ordinary text. User-defined tokens are matched either
    /// way. The empty text gives just the added tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let all = 0..text.len();
        let special = if parse_special {
            std::slice::from_ref(&all)
        } else {
            &[]
        };
        self.encode_ranges(text, special, add_special)
    }

    /// Tokenizes `text` with special-token parsing on exactly inside the byte ranges
    /// `special` (sorted, disjoint, on character boundaries) and off elsewhere. Raw text is
    /// tokenized in maximal runs between special tokens, so a literal range does not change
    /// how the text around it is split.
    pub fn encode_ranges(
        &self,
        text: &str,
        special: &[Range<usize>],
        add_special: bool,
    ) -> Result<Vec<u32>> {
        let v = &self.vocab;
        let mut out = Vec::new();
        self.open(add_special, &mut out);
        for frag in self.partitioner.partition(v, text.as_bytes(), special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(r) => match &self.engine {
                    Engine::Hf(hf) => {
                        let enc = hf
                            .encode_fast(&text[r], false)
                            .map_err(|e| TokenizerError::Hf(e.to_string()))?;
                        out.extend_from_slice(enc.get_ids());
                    }
                    Engine::Wpm(w) => w.tokenize(v, text[r].as_bytes(), &mut out)?,
                    Engine::Ugm(u) => u.tokenize(v, text[r].as_bytes(), &mut out)?,
                },
            }
        }
        self.close(add_special, &mut out);
        Ok(out)
    }

    /// The tokens `add_special` puts first: BOS where the model adds it (always for
    /// WordPiece, whose `add_bos` is forced on at load, as llama.cpp's `tokenize` adds
    /// [CLS] there whatever the flag says).
    fn open(&self, add_special: bool, out: &mut Vec<u32>) {
        let v = &self.vocab;
        if add_special && v.add_bos {
            out.extend(v.special.bos);
        }
    }

    /// The tokens `add_special` puts last: EOS where the model adds it, and for WordPiece
    /// the separator (llama.cpp's `tokenize` for `LLAMA_VOCAB_TYPE_WPM`; load checked that
    /// the vocabulary has one).
    fn close(&self, add_special: bool, out: &mut Vec<u32>) {
        let v = &self.vocab;
        if add_special && v.add_eos {
            out.extend(v.special.eos);
        }
        if add_special && v.kind == VocabKind::Wpm {
            out.extend(v.special.sep);
        }
    }

    /// Tokenizes raw bytes, UTF-8 or not, as `llama_tokenize` does. Valid UTF-8 is
    /// [`Tokenizer::encode`]. Otherwise special tokens are cut out of the bytes first; then
    /// byte-level BPE and Gemma 4's BPE read each raw fragment as llama.cpp's BPE path does
    /// ([`text_from_bytes`]), and SentencePiece works on its bytes as llama.cpp's
    /// `llm_tokenizer_spm_session` does: each symbol is as long as its first byte says, a
    /// symbol that is not a character never merges and becomes byte tokens, and the runs of
    /// characters between such symbols are tokenized as usual. WordPiece reads the bytes as
    /// llama.cpp's `unicode_cpts_from_utf8` does (a byte that starts no character is U+FFFD,
    /// which WordPiece drops; overlong forms decode); Unigram normalizes bytes anyway
    /// (`normalize_prefix`: a byte that starts no character becomes U+FFFD).
    ///
    /// Errors: [`TokenizerError::Hf`] if the SentencePiece vocabulary lacks a byte token;
    /// [`TokenizerError::BeyondUnicode`] for WordPiece input decoding beyond U+10FFFF
    /// (llama.cpp throws there).
    pub fn encode_bytes(
        &self,
        bytes: &[u8],
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>> {
        if let Ok(text) = std::str::from_utf8(bytes) {
            return self.encode(text, add_special, parse_special);
        }
        let v = &self.vocab;
        let all = 0..bytes.len();
        let special = if parse_special {
            std::slice::from_ref(&all)
        } else {
            &[]
        };
        let mut out = Vec::new();
        self.open(add_special, &mut out);
        for frag in self.partitioner.partition(v, bytes, special) {
            match frag {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(r) => match &self.engine {
                    Engine::Wpm(w) => w.tokenize(v, &bytes[r], &mut out)?,
                    Engine::Ugm(u) => u.tokenize(v, &bytes[r], &mut out)?,
                    Engine::Hf(_) if v.kind == VocabKind::Spm => {
                        self.spm_bytes(&bytes[r], &mut out)?
                    }
                    // Gemma 4's BPE reads the bytes as llama.cpp's BPE path does too.
                    Engine::Hf(hf) => {
                        let enc = hf
                            .encode_fast(text_from_bytes(&bytes[r]).as_ref(), false)
                            .map_err(|e| TokenizerError::Hf(e.to_string()))?;
                        out.extend_from_slice(enc.get_ids());
                    }
                },
            }
        }
        self.close(add_special, &mut out);
        Ok(out)
    }

    /// One raw SentencePiece fragment that is not UTF-8 (see [`Tokenizer::encode_bytes`]).
    fn spm_bytes(&self, raw: &[u8], out: &mut Vec<u32>) -> Result<()> {
        use tokenizers::Model;
        const SPACE: &[u8] = "\u{2581}".as_bytes();
        let mut text = Vec::with_capacity(raw.len() + 8);
        if self.vocab.add_space_prefix {
            text.extend_from_slice(SPACE);
        }
        for &b in raw {
            if b == b' ' {
                text.extend_from_slice(SPACE);
            } else {
                text.push(b);
            }
        }
        let hf = |e: tokenizers::Error| TokenizerError::Hf(e.to_string());
        let Engine::Hf(pipeline) = &self.engine else {
            return Err(TokenizerError::Hf("no SentencePiece pipeline".into()));
        };
        let model = pipeline.get_model();
        let flush = |run: &[u8], out: &mut Vec<u32>| -> Result<()> {
            if let Ok(s) = std::str::from_utf8(run) {
                if !s.is_empty() {
                    out.extend(model.tokenize(s).map_err(hf)?.iter().map(|t| t.id));
                }
            }
            Ok(())
        };
        let (mut run, mut i) = (0, 0);
        while i < text.len() {
            let len = match text[i] >> 4 {
                0xc | 0xd => 2,
                0xe => 3,
                0xf => 4,
                _ => 1,
            }
            .min(text.len() - i);
            let sym = &text[i..i + len];
            if std::str::from_utf8(sym).is_err() {
                flush(&text[run..i], out)?;
                for &b in sym {
                    let id = self
                        .token_id(&format!("<0x{b:02X}>"))
                        .ok_or_else(|| TokenizerError::Hf(format!("no byte token <0x{b:02X}>")))?;
                    out.push(id);
                }
                run = i + len;
            }
            i += len;
        }
        flush(&text[run..], out)
    }

    fn check_id(&self, id: u32) -> Result<()> {
        if (id as usize) < self.vocab.n_tokens() {
            Ok(())
        } else {
            Err(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.vocab.n_tokens(),
            })
        }
    }

    /// The bytes token `id` renders as (`llama_token_to_piece` with no stripping): control
    /// tokens are empty unless `render_special`. Not necessarily UTF-8 (byte tokens, or a
    /// byte-level token holding part of a character).
    ///
    /// Errors: [`TokenizerError::IdOutOfRange`].
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> Result<&[u8]> {
        self.check_id(id)?;
        Ok(self.pieces.get(id, render_special))
    }

    /// The exact bytes `ids` detokenize to, as `llama_detokenize(ids, remove_special = false,
    /// unparse_special = render_special)`.
    ///
    /// Errors: [`TokenizerError::IdOutOfRange`].
    pub fn decode_bytes(&self, ids: &[u32], render_special: bool) -> Result<Vec<u8>> {
        let mut d = self.stream_decoder(render_special);
        let mut out = Vec::new();
        for &id in ids {
            d.push_bytes(id, &mut out)?;
        }
        d.finish_bytes(&mut out);
        Ok(out)
    }

    /// The text `ids` detokenize to ([`Tokenizer::decode_bytes`], with each invalid UTF-8
    /// sequence replaced by U+FFFD as `String::from_utf8_lossy` does).
    ///
    /// Errors: [`TokenizerError::IdOutOfRange`].
    pub fn decode(&self, ids: &[u32], render_special: bool) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids, render_special)?).into_owned())
    }

    /// A decoder for ids arriving one at a time; see [`StreamDecoder`].
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder {
            tok: self,
            render_special,
            shown: Vec::new(),
            first: true,
            cleaner: self.vocab.clean_spaces.then(SpaceCleaner::default),
            pending: Vec::new(),
        }
    }

    /// Whether `id` ends generation (`llama_vocab_is_eog`).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, ascending: EOS, EOT, EOM, the FIM pad/repo/separator tokens
    /// and every token llama.cpp recognises by name (`<|im_end|>`, `<end_of_turn>`,
    /// `<|endoftext|>`, `</s>`, …).
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// BOS id, if any.
    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// EOS id, if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// End-of-turn id (the metadata's, else a token named as llama.cpp looks for one), if
    /// any.
    pub fn eot_id(&self) -> Option<u32> {
        self.vocab.special.eot
    }

    /// Separator id ([SEP] of BERT vocabularies), if any.
    pub fn sep_id(&self) -> Option<u32> {
        self.vocab.special.sep
    }

    /// Padding id, if any.
    pub fn pad_id(&self) -> Option<u32> {
        self.vocab.special.pad
    }

    /// Unknown-token id, if any.
    pub fn unk_id(&self) -> Option<u32> {
        self.vocab.special.unk
    }

    /// `tokenizer.ggml.add_sep_token` (default: true for WordPiece, false otherwise), as
    /// `llama_vocab_get_add_sep` reports it: whether llama-server's rerank prompt puts the
    /// separator between query and document. [`Tokenizer::encode`] does not read it
    /// (WordPiece appends [SEP] with `add_special` whatever it says, as llama.cpp does).
    pub fn add_sep(&self) -> bool {
        self.vocab.add_sep
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS (always for WordPiece).
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }

    /// Whether SentencePiece text gets a leading `▁` (and the first decoded piece loses one
    /// leading space).
    pub fn add_space_prefix(&self) -> bool {
        self.vocab.add_space_prefix
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }

    /// The tokenizer family.
    pub fn kind(&self) -> VocabKind {
        self.vocab.kind
    }

    /// The BPE pre-tokenizer (`None` for SentencePiece).
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        self.vocab.pre
    }

    /// The stored text of token `id` (byte-level or `▁`-escaped as in the vocabulary).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.tokens.get(id as usize)
    }

    /// The attributes of token `id`, after llama.cpp's load-time adjustments.
    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.vocab.attrs.get(id as usize).copied()
    }

    /// The id of the control token whose text is `text` (`None`: no such token, or one
    /// that is not a control token, such as a user-defined token that renders as text).
    pub fn control_token(&self, text: &str) -> Option<u32> {
        let id = self.token_id(text)?;
        self.token_attr(id)?.has(TokenAttr::CONTROL).then_some(id)
    }

    /// The id of the token whose stored text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.engine {
            Engine::Hf(hf) => hf.token_to_id(text),
            Engine::Wpm(_) | Engine::Ugm(_) => self.vocab.text_to_id.get(text).copied(),
        }
    }

    /// The underlying `tokenizers` pipeline for one raw fragment (no special-token handling,
    /// no BOS/EOS): what [`Tokenizer::encode`] runs between special tokens. `None` for
    /// WordPiece and Unigram, which frink tokenizes with its own code.
    pub fn hf(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.engine {
            Engine::Hf(hf) => Some(hf),
            Engine::Wpm(_) | Engine::Ugm(_) => None,
        }
    }

    /// `general.architecture` of the file.
    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// Text from raw input bytes the way llama.cpp's BPE path decodes them
/// (`unicode_cpt_from_utf8` in src/unicode.cpp): a lead byte followed by enough continuation
/// bytes gives the code point its bits spell, overlong forms included (`C0 BC` is `<`);
/// anything else gives one U+FFFD for its first byte and decoding resumes at the next byte
/// (so a truncated 3-byte sequence gives three U+FFFD, where `String::from_utf8_lossy` gives
/// one). Where the bits spell a surrogate or a value above U+10FFFF, which llama.cpp carries
/// on with (or fails on) but a Rust string cannot hold, the first byte becomes U+FFFD too.
pub fn text_from_bytes(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    let mut i = 0;
    while i < bytes.len() {
        let b0 = u32::from(bytes[i]);
        let (len, lead_bits) = match bytes[i] {
            0x00..=0x7f => (1, b0),
            0xc0..=0xdf => (2, b0 & 0x1f),
            0xe0..=0xef => (3, b0 & 0x0f),
            0xf0..=0xf7 => (4, b0 & 0x07),
            _ => (0, 0),
        };
        let tail = bytes.get(i + 1..i + len.max(1)).filter(|_| len > 0);
        let cp = tail
            .filter(|t| t.iter().all(|&b| b & 0xc0 == 0x80))
            .map(|t| {
                t.iter()
                    .fold(lead_bits, |cp, &b| (cp << 6) | u32::from(b & 0x3f))
            });
        match cp.and_then(char::from_u32) {
            Some(c) => {
                out.push(c);
                i += len;
            }
            None => {
                out.push('\u{FFFD}');
                i += 1;
            }
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Detokenizes ids as they arrive, returning text only in complete UTF-8 characters.
///
/// The concatenation of everything [`StreamDecoder::push`] returns and what
/// [`StreamDecoder::finish`] returns equals [`Tokenizer::decode`] of all the ids: pieces are
/// joined as bytes, an incomplete character is held until its last byte arrives (or becomes
/// U+FFFD if the sequence turns out invalid or the stream ends), and for vocabularies that
/// clean up spaces a space is held until the next character shows whether it stays.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    render_special: bool,
    /// Control tokens rendered as their text even without `render_special`.
    shown: Vec<u32>,
    first: bool,
    cleaner: Option<SpaceCleaner>,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// This decoder, rendering the control tokens `ids` as their text (llama-server's
    /// "preserved tokens": the markers of a tool-call format, such as Mistral's
    /// `[TOOL_CALLS]`, that a parser must see).
    pub fn showing(mut self, ids: &[u32]) -> Self {
        self.shown = ids.to_vec();
        self
    }

    fn push_bytes(&mut self, id: u32, out: &mut Vec<u8>) -> Result<()> {
        let render = self.render_special || self.shown.contains(&id);
        let mut piece = self.tok.token_to_piece(id, render)?;
        if std::mem::take(&mut self.first) && self.tok.vocab.add_space_prefix {
            piece = piece.strip_prefix(b" ").unwrap_or(piece);
        }
        match &mut self.cleaner {
            Some(c) => c.push(piece, out),
            None => out.extend_from_slice(piece),
        }
        Ok(())
    }

    fn finish_bytes(&mut self, out: &mut Vec<u8>) {
        if let Some(c) = &mut self.cleaner {
            c.finish(out);
        }
    }

    /// Adds one id; returns the text that is now final (possibly empty).
    ///
    /// Errors: [`TokenizerError::IdOutOfRange`] (the decoder is unchanged).
    pub fn push(&mut self, id: u32) -> Result<String> {
        let mut bytes = std::mem::take(&mut self.pending);
        let res = self.push_bytes(id, &mut bytes);
        let mut out = String::new();
        drain_utf8(&mut bytes, &mut out, false);
        self.pending = bytes;
        res.map(|()| out)
    }

    /// Ends the stream; returns the text still held back.
    pub fn finish(mut self) -> String {
        let mut bytes = std::mem::take(&mut self.pending);
        self.finish_bytes(&mut bytes);
        let mut out = String::new();
        drain_utf8(&mut bytes, &mut out, true);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::text_from_bytes;

    #[test]
    fn tokenizers_are_shareable_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::Tokenizer>();
        send_sync::<super::StreamDecoder<'static>>();
    }

    #[test]
    fn invalid_utf8_becomes_one_replacement_per_undecodable_byte() {
        assert_eq!(text_from_bytes(b"ok \xc3\xa9"), "ok é");
        assert_eq!(
            text_from_bytes(b"\xf0\x9f\x98A"),
            "\u{FFFD}\u{FFFD}\u{FFFD}A"
        );
        assert_eq!(
            text_from_bytes(b"\x80\xff\xe2\x82\xac"),
            "\u{FFFD}\u{FFFD}€"
        );
        assert_eq!(text_from_bytes(b"\xe2\x82"), "\u{FFFD}\u{FFFD}");
        // Overlong forms decode (llama.cpp does not check); surrogates cannot.
        assert_eq!(text_from_bytes(b"\xc0\xbc|\xe0\x80\x80"), "<|\0");
        assert_eq!(text_from_bytes(b"\xed\xa0\x80"), "\u{FFFD}\u{FFFD}\u{FFFD}");
    }
}
