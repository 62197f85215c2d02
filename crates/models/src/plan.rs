//! The layer plan: what each layer of a loaded model computes, compiled once at load from
//! the architecture row ([`crate::arch::ArchSpec`]), the metadata ([`crate::ModelConfig`])
//! and the tensors present. The forward pass walks it ([`crate::Model::forward_batch`]);
//! `frink inspect MODEL --plan` prints it ([`Plan`]'s `Display`).
//!
//! Each layer is a token mixer (attention, a state-space scan, a short convolution) and a
//! channel mixer (a dense FFN, experts, or none), with its norms and residual wiring. The
//! weights each block reads are loaded by the block itself ([`crate::blocks`]).

use frink_gguf::GgufFile;

use crate::arch::{
    Activation, ArchSpec, Ffn, MixerKind, Norm, NormPlacement, Position, QkNorm, Recurrent,
};
use crate::rope::RopeParams;

/// The plan of every layer, plus the model-level steps around them.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// `general.architecture`.
    pub arch: &'static str,
    /// The norm kind of every norm of the model.
    pub norm: Norm,
    /// A norm right after the embedding lookup (bloom's `token_embd_norm`).
    pub embd_norm: bool,
    /// The tensor of the norm before the LM head (`output_norm`, LFM2's `token_embd_norm`;
    /// none for BERT).
    pub output_norm: Option<&'static str>,
    /// An encoder ([`crate::arch::ArchSpec::encoder`]): bidirectional attention over a
    /// whole input, hidden states out, no LM head.
    pub encoder: bool,
    /// Width of Gemma 4's per-layer embeddings added after every layer (0: none;
    /// [`crate::blocks::ple`]).
    pub per_layer_embeddings: usize,
    pub layers: Vec<LayerPlan>,
}

/// One layer: `x += mixer(norm(x))`, then `x += channel(norm(x))` (sequential), or both
/// from one normed input (parallel), with the norms [`Norms`] says.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    pub mixer: Mixer,
    pub channel: Channel,
    pub norms: Norms,
    pub residual: Residual,
}

/// A layer's token mixer: what mixes information across positions.
#[derive(Clone, Debug, PartialEq)]
pub enum Mixer {
    /// Softmax attention over the sequence's KV cache ([`crate::blocks::attention`]).
    Attention(AttentionPlan),
    /// Mamba-1's selective scan ([`crate::blocks::mamba`]).
    Mamba,
    /// Mamba-2's SSD scan ([`crate::blocks::mamba2`]), with its gated grouped RMSNorm
    /// where the file has `ssm_norm` (falcon-h1's has none: `y · silu(z)`).
    Mamba2 { gated_norm: bool },
    /// LFM2's gated short convolution ([`crate::blocks::short_conv`]).
    ShortConv,
    /// Qwen3-Next's gated DeltaNet ([`crate::blocks::delta_net`]).
    GatedDeltaNet,
    /// Attention and a recurrent mixer on the same input, outputs added in this order
    /// (falcon-h1: `attention + mamba2`).
    Parallel(Box<Mixer>, Box<Mixer>),
}

impl Mixer {
    /// Whether this mixer rotates queries and keys (RoPE in an attention part).
    pub fn uses_rope(&self) -> bool {
        match self {
            Mixer::Attention(a) => matches!(a.position, Position::Rope(_)),
            Mixer::Parallel(a, b) => a.uses_rope() || b.uses_rope(),
            _ => false,
        }
    }

    /// Whether the mixer keeps a recurrent state (which cannot be cut back to an earlier
    /// position, unlike a KV cache).
    pub fn is_recurrent(&self) -> bool {
        match self {
            Mixer::Attention(_) => false,
            Mixer::Parallel(a, b) => a.is_recurrent() || b.is_recurrent(),
            _ => true,
        }
    }

    /// The sliding window of its attention (0: it sees every earlier key, or it has no
    /// attention).
    pub fn window(&self) -> usize {
        self.attention().map_or(0, |a| a.window)
    }

    /// The widths `(n_head_kv · head_dim_k, n_head_kv · head_dim_v)` of the keys and values
    /// it caches per position, if it keeps a cache of its own (attention that shares no
    /// other layer's).
    pub fn kv_dims(&self, n_head_kv: usize) -> Option<(usize, usize)> {
        let a = self
            .attention()
            .filter(|a| a.geometry.kv_source.is_none())?;
        Some((
            n_head_kv * a.geometry.head_dim_k,
            n_head_kv * a.geometry.head_dim_v,
        ))
    }

    /// Its attention, alone or beside a recurrent mixer (falcon-h1), if it has one.
    pub fn attention(&self) -> Option<&AttentionPlan> {
        match self {
            Mixer::Attention(a) => Some(a),
            Mixer::Parallel(a, b) => a.attention().or(b.attention()),
            _ => None,
        }
    }

    /// Whether the mixer keeps keys and values (attention).
    pub fn has_attention(&self) -> bool {
        self.attention().is_some()
    }
}

/// How an attention layer computes Q, K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QkvLayout {
    /// `attn_q`, `attn_k`, `attn_v`.
    Separate,
    /// One `attn_qkv` (rows Q, K, V).
    Fused,
    /// Multi-head latent attention ([`crate::blocks::mla`]).
    Latent,
}

/// The sizes of one attention layer's heads and where its keys and values come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnGeometry {
    /// Key (and query) and value head sizes.
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Dimensions rotated per head.
    pub n_rot: usize,
    /// The layer whose keys and values it attends over, when not its own (Gemma 4's KV
    /// sharing, [`crate::arch::ArchSpec::kv_sharing`]): it computes no keys or values and
    /// keeps no cache.
    pub kv_source: Option<usize>,
    /// RoPE divides its frequencies by `rope_freqs.weight` where the file has it
    /// ([`crate::arch::RopeFreqs`]).
    pub freq_factors: bool,
}

/// The options of one attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionPlan {
    pub qkv: QkvLayout,
    /// Head sizes, rotation and KV source of this layer.
    pub geometry: AttnGeometry,
    /// Each head of V scaled to unit RMS before it is cached (Gemma 4).
    pub v_norm: bool,
    /// RoPE (with this layer's parameters), ALiBi, or no positions.
    pub position: Position,
    pub rope: RopeParams,
    /// Keys older than this many positions are not seen (0: all are). A chunked layer's
    /// window is its chunk: no query sees further back, so the cache keeps that many rows.
    pub window: usize,
    /// Chunked attention (0: none): a query at position `p` sees only the keys of its
    /// chunk, `⌊p / chunk⌋ · chunk ..= p` ([`crate::arch::SwaPattern::Chunked`]).
    pub chunk: usize,
    /// The queries at position `p` are multiplied by `t.factor(p)` (Llama 4's NoPE
    /// layers, [`crate::arch::AttnTemperature`]).
    pub temperature: Option<crate::arch::AttnTemperature>,
    pub qk_norm: QkNorm,
    /// `attn_sinks`: a learned logit per head in each softmax's denominator.
    pub sinks: bool,
    /// Scores become `c · tanh(s / c)`.
    pub softcap: Option<f32>,
    /// The output is multiplied by `sigmoid(gate)`, the gate from the Q projection
    /// ([`crate::arch::ArchSpec::attn_output_gate`]).
    pub output_gate: bool,
}

/// A layer's channel mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// A dense FFN of the row's kind and activation ([`crate::blocks::ffn`]).
    Dense(Ffn, Activation),
    /// Routed experts, with a shared expert where the file has one ([`crate::blocks::moe`]).
    Moe(Activation),
    /// None (Mamba's layers are the mixer alone).
    None,
}

/// Which norms a layer has (all of the model's [`Norm`] kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Norms {
    /// `attn_norm`, before the token mixer.
    pub pre_mixer: bool,
    /// `post_attention_norm`, on the mixer's output.
    pub post_mixer: bool,
    /// The weight tensor of the norm before the channel mixer (`ffn_norm.weight`,
    /// gpt-oss's `post_attention_norm.weight`, falcon-h1's bare `ffn_norm`), if any.
    pub pre_channel: Option<&'static str>,
    /// `post_ffw_norm`, on the channel mixer's output.
    pub post_channel: bool,
    /// The post norms apply after the residual adds, to the stream itself, and are
    /// `attn_output_norm` / `layer_output_norm` (BERT: [`NormPlacement::PostResidual`]).
    pub after_residual: bool,
}

/// How a layer's two mixers reach the residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// The channel mixer reads the residual after the token mixer's add.
    Sequential,
    /// Both read the same normed input; both outputs are added (falcon).
    Parallel,
}

/// What [`Plan::compile`] takes from the metadata, beside the row.
pub struct PlanInputs<'a> {
    /// Per layer: attention (else the row's recurrent mixer).
    pub attn_layers: &'a [bool],
    /// Per layer: the sliding window applies.
    pub swa_layers: &'a [bool],
    pub n_swa: usize,
    pub rope_global: RopeParams,
    pub rope_swa: RopeParams,
    pub attn_softcap: Option<f32>,
    /// How attention sees positions (the row's, or none: Granite 4.0-H without fine-tuned
    /// RoPE).
    pub position: Position,
    /// Multi-head latent attention (`attention.kv_lora_rank` on a row that allows it).
    pub mla: bool,
    /// Per layer: experts rather than a dense FFN ([`crate::config::MoeConfig::is_moe_layer`]).
    pub moe_layers: &'a [bool],
    /// The windowed layers' window is a chunk ([`crate::arch::SwaPattern::Chunked`]).
    pub chunked: bool,
    /// Per layer: no positions, queries scaled by the row's temperature (Llama 4's NoPE
    /// layers, [`crate::arch::Irope`]).
    pub nope_layers: &'a [bool],
    /// The Q/K norm of the layers that rotate (the row's, or none where the file turns it
    /// off); a NoPE layer's L2 norm is none.
    pub qk_norm: QkNorm,
    /// Per layer: head sizes, rotation, KV source.
    pub geometry: &'a [AttnGeometry],
    /// V-norm on every attention layer ([`crate::arch::ArchSpec::v_norm`]).
    pub v_norm: bool,
    /// Width of the per-layer embeddings (0: none).
    pub per_layer_embeddings: usize,
}

impl Plan {
    /// Whether any layer applies RoPE (what the RoPE overrides can change).
    pub fn uses_rope(&self) -> bool {
        self.layers.iter().any(|l| l.mixer.uses_rope())
    }

    /// The plan of the model in `f` under row `arch`. Tensor presence decides only what
    /// the row leaves to the file: fused or separate Q/K/V and attention sinks.
    pub fn compile(arch: &'static ArchSpec, f: &GgufFile, m: &PlanInputs<'_>) -> Plan {
        let has = |il: usize, name: &str| f.tensor_index(&format!("blk.{il}.{name}")).is_some();
        let layers = (0..m.attn_layers.len())
            .map(|il| {
                let recurrent = arch.mixer.recurrent().map(|r| match r {
                    Recurrent::Mamba => Mixer::Mamba,
                    Recurrent::Mamba2 => Mixer::Mamba2 {
                        gated_norm: has(il, "ssm_norm.weight"),
                    },
                    Recurrent::ShortConv => Mixer::ShortConv,
                    Recurrent::GatedDeltaNet => Mixer::GatedDeltaNet,
                });
                let attention = m.attn_layers[il].then(|| {
                    let swa = m.swa_layers[il];
                    let nope = m.nope_layers[il];
                    Mixer::Attention(AttentionPlan {
                        qkv: if m.mla {
                            QkvLayout::Latent
                        } else if has(il, "attn_qkv.weight") {
                            QkvLayout::Fused
                        } else {
                            QkvLayout::Separate
                        },
                        geometry: m.geometry[il],
                        v_norm: m.v_norm,
                        position: if nope { Position::None } else { m.position },
                        rope: if swa { m.rope_swa } else { m.rope_global },
                        window: if swa { m.n_swa } else { 0 },
                        chunk: if swa && m.chunked { m.n_swa } else { 0 },
                        temperature: arch.irope.filter(|_| nope).map(|ir| ir.temperature),
                        qk_norm: match m.qk_norm {
                            QkNorm::L2 if nope => QkNorm::None,
                            q => q,
                        },
                        sinks: has(il, "attn_sinks.weight"),
                        softcap: m.attn_softcap,
                        output_gate: arch.attn_output_gate,
                    })
                });
                let mixer = match (attention, recurrent, arch.mixer) {
                    (Some(a), Some(r), MixerKind::Parallel(_)) => {
                        Mixer::Parallel(Box::new(a), Box::new(r))
                    }
                    (Some(a), _, _) => a,
                    (None, Some(r), _) => r,
                    (None, None, _) => {
                        unreachable!("a layer without attention has a recurrent mixer")
                    }
                };
                let channel = match m.moe_layers[il] {
                    _ if !arch.has_ffn => Channel::None,
                    true => Channel::Moe(arch.activation),
                    false => Channel::Dense(arch.ffn, arch.activation),
                };
                let (pre, sandwich) = match arch.norm_placement {
                    NormPlacement::Pre => (true, false),
                    NormPlacement::Sandwich => (true, true),
                    NormPlacement::PostOnly | NormPlacement::PostResidual => (false, true),
                };
                let parallel = arch.parallel_residual;
                let has_channel = channel != Channel::None;
                LayerPlan {
                    mixer,
                    channel,
                    norms: Norms {
                        pre_mixer: pre,
                        post_mixer: sandwich,
                        pre_channel: (pre && !parallel && has_channel)
                            .then_some(arch.ffn_norm_name),
                        post_channel: sandwich && has_channel,
                        after_residual: arch.norm_placement == NormPlacement::PostResidual,
                    },
                    residual: if parallel {
                        Residual::Parallel
                    } else {
                        Residual::Sequential
                    },
                }
            })
            .collect();
        Plan {
            arch: arch.name,
            norm: arch.norm,
            embd_norm: arch.embd_norm,
            output_norm: arch.output_norm_name,
            encoder: arch.encoder,
            per_layer_embeddings: m.per_layer_embeddings,
            layers,
        }
    }

    /// Whether any layer keeps a recurrent state.
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(|l| l.mixer.is_recurrent())
    }

    /// The longest sliding window of its attention layers (0: none has one). A windowed
    /// layer's keys and values older than this are never read again, so the KV cache
    /// gives their rows back ([`crate::SeqState`], [`crate::KvPool`]). An encoder's
    /// windows are symmetric over a whole input, every key of which it keeps: 0.
    pub fn window(&self) -> usize {
        if self.encoder {
            return 0;
        }
        self.layers
            .iter()
            .map(|l| l.mixer.window())
            .max()
            .unwrap_or(0)
    }
}

impl std::fmt::Display for Mixer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mixer::Attention(a) => {
                let qkv = match a.qkv {
                    QkvLayout::Separate => "q/k/v",
                    QkvLayout::Fused => "fused qkv",
                    QkvLayout::Latent => "latent (MLA)",
                };
                write!(f, "attention [{qkv}")?;
                match a.position {
                    Position::Rope(layout) => {
                        write!(f, ", RoPE {layout:?} base {}", a.rope.freq_base)?;
                        if a.rope.freq_scale != 1.0 {
                            write!(f, " scale {}", a.rope.freq_scale)?;
                        }
                        if a.rope.yarn.is_some() {
                            write!(f, " YaRN")?;
                        }
                    }
                    Position::Alibi => write!(f, ", ALiBi")?,
                    Position::None => write!(f, ", no positions")?,
                    Position::Learned => write!(f, ", learned positions")?,
                }
                if a.chunk > 0 {
                    write!(f, ", chunks of {}", a.chunk)?;
                } else if a.window > 0 {
                    write!(f, ", window {}", a.window)?;
                }
                if a.temperature.is_some() {
                    write!(f, ", query temperature")?;
                }
                let g = a.geometry;
                if g.freq_factors && matches!(a.position, Position::Rope(_)) {
                    write!(f, ", rope_freqs")?;
                }
                if let Some(src) = g.kv_source {
                    write!(f, ", keys and values of layer {src}")?;
                }
                if a.v_norm {
                    write!(f, ", V norm")?;
                }
                match a.qk_norm {
                    QkNorm::None => {}
                    QkNorm::PerHead => write!(f, ", per-head Q/K norm")?,
                    QkNorm::Whole => write!(f, ", whole Q/K norm")?,
                    QkNorm::L2 => write!(f, ", L2 Q/K norm after RoPE")?,
                }
                if a.sinks {
                    write!(f, ", sinks")?;
                }
                if let Some(c) = a.softcap {
                    write!(f, ", softcap {c}")?;
                }
                if a.output_gate {
                    write!(f, ", output gate")?;
                }
                write!(f, "]")
            }
            Mixer::Mamba => write!(f, "mamba scan"),
            Mixer::Mamba2 { gated_norm: true } => write!(f, "mamba2 scan (gated norm)"),
            Mixer::Mamba2 { gated_norm: false } => write!(f, "mamba2 scan"),
            Mixer::ShortConv => write!(f, "short conv"),
            Mixer::GatedDeltaNet => write!(f, "gated deltanet"),
            Mixer::Parallel(a, b) => write!(f, "{a} ∥ {b}"),
        }
    }
}

impl std::fmt::Display for LayerPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.mixer)?;
        match self.channel {
            Channel::Dense(kind, act) => write!(f, " + {kind:?} FFN ({act:?})")?,
            Channel::Moe(act) => write!(f, " + experts ({act:?})")?,
            Channel::None => {}
        }
        let n = self.norms;
        let mut norms = Vec::new();
        if n.pre_mixer {
            norms.push("attn_norm before the mixer".to_string());
        }
        if n.post_mixer && n.after_residual {
            norms.push("attn_output_norm after its residual add".to_string());
        } else if n.post_mixer {
            norms.push("post_attention_norm after it".to_string());
        }
        if let Some(name) = n.pre_channel {
            let stem = name.strip_suffix(".weight").unwrap_or(name);
            norms.push(format!("{stem} before the FFN"));
        }
        if n.post_channel && n.after_residual {
            norms.push("layer_output_norm after the FFN's residual add".to_string());
        } else if n.post_channel {
            norms.push("post_ffw_norm after it".to_string());
        }
        write!(f, "; norms {}", norms.join(", "))?;
        if self.residual == Residual::Parallel {
            write!(f, "; parallel residual")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Plan {
    /// One line per run of identical layers, e.g. `layers 0-4, 6-10: attention [...] + ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} ({} layers, {:?} norms{}{}{}, final {})",
            self.arch,
            self.layers.len(),
            self.norm,
            if self.embd_norm {
                ", token_embd_norm after the embedding"
            } else {
                ""
            },
            match self.per_layer_embeddings {
                0 => String::new(),
                w => format!(", per-layer embeddings of {w} after every layer"),
            },
            if self.encoder {
                ", encoder (bidirectional, hidden states out)"
            } else {
                ""
            },
            self.output_norm.unwrap_or("none")
        )?;
        // Head sizes, where the attention layers differ in them (Gemma 4).
        let sizes = |l: &LayerPlan| match &l.mixer {
            Mixer::Attention(a) => Some((
                a.geometry.head_dim_k,
                a.geometry.head_dim_v,
                a.geometry.n_rot,
            )),
            _ => None,
        };
        let mut all: Vec<_> = self.layers.iter().filter_map(sizes).collect();
        all.dedup();
        // Distinct layer descriptions in first-seen order, with the layers of each.
        let mut kinds: Vec<(String, Vec<usize>)> = Vec::new();
        for (il, l) in self.layers.iter().enumerate() {
            let mut d = l.to_string();
            if let (true, Some((k, v, r))) = (all.len() > 1, sizes(l)) {
                d.push_str(&format!("; head dim {k}/{v}, RoPE over {r}"));
            }
            match kinds.iter_mut().find(|(k, _)| *k == d) {
                Some((_, ls)) => ls.push(il),
                None => kinds.push((d, vec![il])),
            }
        }
        for (d, ls) in kinds {
            // Runs of consecutive layers as `a-b`.
            let mut runs: Vec<String> = Vec::new();
            let mut i = 0;
            while i < ls.len() {
                let mut j = i;
                while j + 1 < ls.len() && ls[j + 1] == ls[j] + 1 {
                    j += 1;
                }
                runs.push(if i == j {
                    ls[i].to_string()
                } else {
                    format!("{}-{}", ls[i], ls[j])
                });
                i = j + 1;
            }
            let word = if ls.len() == 1 { "layer" } else { "layers" };
            writeln!(f, "  {word} {}: {d}", runs.join(", "))?;
        }
        Ok(())
    }
}
