//! What an encoder (BERT family, [`crate::arch::ArchSpec::encoder`]) has beside its
//! layers: learned position rows and token-type (segment) rows added to the token
//! embeddings, and the classifier head of a cross-encoder (reranker) applied to the pooled
//! row (llama.cpp src/models/bert.cpp and `build_pooling` in src/llama-graph.cpp, rank
//! pooling; transformers `BertEmbeddings`, `RobertaClassificationHead`,
//! `BertForSequenceClassification`).

use crate::error::{ModelError, Result};
use crate::forward::{Logits, Sequence};
use crate::kernels::{add_bias, matmul, matrix_row, Matrix};
use crate::kv::KvType;
use crate::load::Loader;
use crate::model::Model;
use crate::state::SeqState;

/// One whole input of [`Model::encode_batch`].
#[derive(Clone, Copy, Debug)]
pub struct EncoderInput<'a> {
    pub tokens: &'a [u32],
    /// One type per token (0: first text, 1: second text of a pair), or empty for all 0.
    pub token_types: &'a [u32],
}

/// A dense layer of the classifier head: `rows × n_embd` weights and their bias, if any.
#[derive(Clone, Debug)]
pub struct Dense {
    pub w: Matrix,
    pub b: Option<Vec<f32>>,
}

/// An encoder's own weights.
#[derive(Clone, Debug)]
pub struct EncoderWeights {
    /// `position_embd`: one row per position (`context_length × n_embd`), for
    /// [`crate::arch::Position::Learned`].
    pub position_embd: Option<Matrix>,
    /// `token_types`: one row per token type (`token_type_count × n_embd`).
    pub token_types: Option<Matrix>,
    /// `cls` (+ bias): the head's first dense layer, followed by tanh (BERT's pooler,
    /// RoBERTa's `classifier.dense`).
    pub cls: Option<Dense>,
    /// `cls.output` (+ bias): the scores, one per label.
    pub cls_out: Option<Dense>,
}

impl EncoderWeights {
    /// Loads the position table (when `learned`), the token types (when the file has
    /// `token_type_count`) and, for an architecture that has one (`rank_head`), the
    /// classifier head where present.
    ///
    /// Errors: [`ModelError::Tensor`] for a missing or misshapen tensor, or a head whose
    /// output layer is missing or has no rows.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        learned: bool,
        rank_head: bool,
        (n_ctx_train, n_token_types, n_embd): (usize, usize, usize),
    ) -> Result<EncoderWeights> {
        let position_embd = match learned {
            true => Some(l.matrix("position_embd.weight", n_ctx_train, n_embd)?),
            false => None,
        };
        let token_types = match n_token_types {
            0 => None,
            n => l.matrix_opt("token_types.weight", n, n_embd)?,
        };
        if !rank_head {
            // Its head's tensors stay unread: the file is refused by the accounting.
            return Ok(EncoderWeights {
                position_embd,
                token_types,
                cls: None,
                cls_out: None,
            });
        }
        let cls = match l.matrix_opt("cls.weight", n_embd, n_embd)? {
            Some(w) => Some(Dense {
                w,
                b: l.vector_opt("cls.bias", n_embd)?,
            }),
            None => None,
        };
        // The head's output rows are its labels (a reranker has one).
        let n_out =
            l.f.tensor("cls.output.weight")
                .map(|t| t.info.n_rows() as usize);
        let cls_out = match n_out {
            Some(0) => {
                return Err(ModelError::Tensor {
                    name: "cls.output.weight".into(),
                    detail: "no rows".into(),
                })
            }
            Some(n) => Some(Dense {
                w: l.matrix("cls.output.weight", n, n_embd)?,
                b: l.vector_opt("cls.output.bias", n)?,
            }),
            None => None,
        };
        if cls.is_some() && cls_out.is_none() {
            return Err(ModelError::Tensor {
                name: "cls.output.weight".into(),
                detail: "missing beside cls.weight".into(),
            });
        }
        Ok(EncoderWeights {
            position_embd,
            token_types,
            cls,
            cls_out,
        })
    }
}

impl Model {
    /// Adds each row's position row and token-type row to the token embeddings `x`
    /// (`pos.len() × n_embd`): `types[i]` is row `i`'s type (`types` empty: all 0, as
    /// llama.cpp's bert.cpp always adds row 0).
    ///
    /// Errors: [`ModelError::ContextFull`] for a position past the table,
    /// [`ModelError::Unsupported`] for a token type past `token_types`' rows.
    pub(crate) fn add_encoder_rows(
        &self,
        e: &EncoderWeights,
        pos: &[usize],
        types: &[u32],
        x: &mut [f32],
    ) -> Result<()> {
        let d = self.config.n_embd;
        let mut row = vec![0f32; d];
        if let Some(p) = &e.position_embd {
            for (xr, &at) in x.chunks_exact_mut(d).zip(pos) {
                if at >= p.rows {
                    return Err(ModelError::ContextFull {
                        needed: at + 1,
                        n_ctx: p.rows,
                    });
                }
                matrix_row(p, self.weight(p), at, &mut row)?;
                xr.iter_mut().zip(&row).for_each(|(a, b)| *a += b);
            }
        }
        if let Some(t) = &e.token_types {
            let mut cached = None;
            for (i, xr) in x.chunks_exact_mut(d).enumerate() {
                let ty = types.get(i).copied().unwrap_or(0) as usize;
                if ty >= t.rows {
                    return Err(ModelError::Unsupported(format!(
                        "token type {ty}: the model has {} (token_type_count)",
                        t.rows
                    )));
                }
                if cached != Some(ty) {
                    matrix_row(t, self.weight(t), ty, &mut row)?;
                    cached = Some(ty);
                }
                xr.iter_mut().zip(&row).for_each(|(a, b)| *a += b);
            }
        } else if types.iter().any(|&t| t != 0) {
            return Err(ModelError::Unsupported(
                "token types on a model without a token-type table".into(),
            ));
        }
        Ok(())
    }

    /// The classifier head's scores of pooled rows `x` (`n × n_embd`, each one input's
    /// first row, as rank pooling selects it): `cls.output(tanh(cls(x)))`, or
    /// `cls.output(x)` for a head without `cls` (llama.cpp `build_pooling`,
    /// `LLAMA_POOLING_TYPE_RANK`). `n × n_labels` values; a reranker's relevance score is
    /// its only label's value, raw (llama-server's `relevance_score`).
    ///
    /// Errors: [`ModelError::Unsupported`] for a model without the head.
    pub fn classify(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let Some(e) = &self.weights.encoder else {
            return Err(no_head(self));
        };
        let Some(out) = &e.cls_out else {
            return Err(no_head(self));
        };
        let d = self.config.n_embd;
        let mut hidden;
        let input = match &e.cls {
            Some(cls) => {
                hidden = vec![0f32; n * d];
                matmul(&cls.w, self.weight(&cls.w), x, n, &mut hidden)?;
                if let Some(b) = &cls.b {
                    add_bias(&mut hidden, b);
                }
                hidden.iter_mut().for_each(|v| *v = v.tanh());
                &hidden[..]
            }
            None => x,
        };
        let mut scores = vec![0f32; n * out.w.rows];
        matmul(&out.w, self.weight(&out.w), input, n, &mut scores)?;
        if let Some(b) = &out.b {
            add_bias(&mut scores, b);
        }
        Ok(scores)
    }

    /// The hidden states (`tokens.len() × n_embd` values each, after the output norm
    /// where the model has one) of whole inputs evaluated together: one
    /// [`Model::forward_batch`] call, each input in a fresh state of its own length with
    /// keys and values kept as `kv_type`. An input's rows do not depend on the others
    /// (batch invariance), so callers may group inputs as they like.
    ///
    /// Errors: those of [`Model::forward_batch`] (an input longer than the position
    /// table: [`ModelError::ContextFull`]).
    pub fn encode_batch(
        &self,
        inputs: &[EncoderInput<'_>],
        kv_type: KvType,
    ) -> Result<Vec<Vec<f32>>> {
        let mut states: Vec<SeqState> = inputs
            .iter()
            .map(|i| SeqState::new(&self.config, i.tokens.len().max(1), kv_type))
            .collect();
        let mut seqs: Vec<Sequence<'_>> = states
            .iter_mut()
            .zip(inputs)
            .map(|(state, i)| Sequence {
                state,
                tokens: i.tokens,
                logits: Logits::Hidden,
                lora: None,
                embd: &[],
                rope_shift: 0,
                token_types: i.token_types,
            })
            .collect();
        self.forward_batch(&mut seqs)
    }

    /// Whether the model has a classifier head ([`Model::classify`]).
    pub fn has_classifier(&self) -> bool {
        self.weights
            .encoder
            .as_ref()
            .is_some_and(|e| e.cls_out.is_some())
    }
}

fn no_head(m: &Model) -> ModelError {
    ModelError::Unsupported(format!(
        "{} has no classifier head (cls.output): it is not a reranker",
        m.config.arch.name
    ))
}
