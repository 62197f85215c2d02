//! Quantization mixes (llama.cpp's `llama_ftype`: `Q4_K_M`, `Q5_K_S`, …) and which ggml type
//! each tensor of a model gets in one: llama.cpp src/llama-quant.cpp
//! (`tensor_allows_quantization`, `llama_tensor_get_type`, `llama_tensor_get_type_impl`,
//! `tensor_type_fallback`, `tensor_requires_imatrix`), followed rule for rule for the mixes
//! frink can make. Tensors are visited in llama.cpp's order (by layer, then by name: its
//! loader's `weight_name_comparer`), because some rules count the tensors seen so far
//! (the first attention-V tensors of a `Q3_K_M` get more bits).

use crate::GgmlType;

/// A quantization mix: its `llama-quantize` name, its `general.file_type` (llama.h
/// `LLAMA_FTYPE_MOSTLY_*`) and the type its tensors get by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// The name `llama-quantize` takes (`Q4_K_M`).
    pub name: &'static str,
    /// `general.file_type`.
    pub file_type: u32,
    /// The default tensor type (`llama_ftype_get_default_type`).
    pub default: GgmlType,
}

const fn mix(name: &'static str, file_type: u32, default: GgmlType) -> Mix {
    Mix {
        name,
        file_type,
        default,
    }
}

/// The mixes frink makes: all of llama-quantize's (llama.h's `LLAMA_FTYPE_MOSTLY_*` values).
pub const MIXES: &[Mix] = &[
    mix("F32", 0, GgmlType::F32),
    mix("F16", 1, GgmlType::F16),
    mix("BF16", 32, GgmlType::BF16),
    mix("Q4_0", 2, GgmlType::Q4_0),
    mix("Q4_1", 3, GgmlType::Q4_1),
    mix("Q5_0", 8, GgmlType::Q5_0),
    mix("Q5_1", 9, GgmlType::Q5_1),
    mix("Q8_0", 7, GgmlType::Q8_0),
    mix("Q2_K", 10, GgmlType::Q2_K),
    mix("Q2_K_S", 21, GgmlType::Q2_K),
    mix("Q3_K_S", 11, GgmlType::Q3_K),
    mix("Q3_K_M", 12, GgmlType::Q3_K),
    mix("Q3_K_L", 13, GgmlType::Q3_K),
    mix("Q4_K_S", 14, GgmlType::Q4_K),
    mix("Q4_K_M", 15, GgmlType::Q4_K),
    mix("Q5_K_S", 16, GgmlType::Q5_K),
    mix("Q5_K_M", 17, GgmlType::Q5_K),
    mix("Q6_K", 18, GgmlType::Q6_K),
    mix("IQ4_NL", 25, GgmlType::IQ4_NL),
    mix("IQ4_XS", 30, GgmlType::IQ4_XS),
    mix("IQ2_XXS", 19, GgmlType::IQ2_XXS),
    mix("IQ2_XS", 20, GgmlType::IQ2_XS),
    mix("IQ2_S", 28, GgmlType::IQ2_XS),
    mix("IQ2_M", 29, GgmlType::IQ2_S),
    mix("IQ3_XXS", 23, GgmlType::IQ3_XXS),
    mix("IQ3_XS", 22, GgmlType::IQ3_S),
    mix("IQ3_S", 26, GgmlType::IQ3_S),
    mix("IQ3_M", 27, GgmlType::IQ3_S),
    mix("IQ1_S", 24, GgmlType::IQ1_S),
    mix("IQ1_M", 31, GgmlType::IQ1_M),
    mix("TQ1_0", 36, GgmlType::TQ1_0),
    mix("TQ2_0", 37, GgmlType::TQ2_0),
    mix("MXFP4_MOE", 38, GgmlType::MXFP4),
];

impl Mix {
    /// The mix named `name` (case-insensitive, as llama-quantize's names).
    ///
    /// Errors: a message naming the mixes frink makes.
    pub fn parse(name: &str) -> Result<Mix, String> {
        let upper = name.to_ascii_uppercase();
        if let Some(m) = MIXES.iter().find(|m| m.name == upper) {
            return Ok(*m);
        }
        let names: Vec<_> = MIXES.iter().map(|m| m.name).collect();
        Err(format!(
            "unknown quantization type {name:?} (one of {})",
            names.join(", ")
        ))
    }

    fn is(&self, name: &str) -> bool {
        self.name == name
    }
}

/// llama-quantize's options that change which type a tensor gets.
#[derive(Default)]
pub struct MixOptions {
    /// `--pure`: every quantizable tensor of the default type (no per-tensor rules).
    pub pure: bool,
    /// `--leave-output-tensor`: `output.weight` as it is.
    pub leave_output: bool,
    /// `--output-tensor-type`.
    pub output_type: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub token_embedding_type: Option<GgmlType>,
    /// `--tensor-type NAME=TYPE`, in order: the type of the first pattern found in a
    /// tensor's name (llama.cpp's `std::regex_search`), given as a matcher.
    pub tensor_types: Vec<(NameMatcher, GgmlType)>,
    /// Whether an importance matrix is given (`--imatrix`, after `--include-weights` /
    /// `--exclude-weights`; llama-quant.cpp's `qs.has_imatrix`): it changes the first
    /// FFN-down layers of IQ4_NL, IQ4_XS, Q4_0 and Q5_0, and a `Q2_K_S` needs it.
    pub has_imatrix: bool,
}

/// Whether a tensor name matches a `--tensor-type` pattern.
pub type NameMatcher = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// What the rules read of a model (its GGUF metadata).
#[derive(Clone, Debug, Default)]
pub struct MixModel {
    /// `general.architecture`.
    pub arch: String,
    /// `n_head / n_head_kv` of the first layer (0 without KV heads).
    pub n_gqa: u32,
    /// `{arch}.expert_count`.
    pub n_expert: u32,
    /// `{arch}.block_count`.
    pub n_layer: u32,
    /// llama.cpp's `LLM_TYPE_70B` (a llama of 80 layers with grouped KV heads).
    pub is_70b: bool,
}

/// A tensor as the rules see it.
pub struct MixTensor<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its type in the input.
    pub ty: GgmlType,
    /// `ne0` first.
    pub shape: &'a [u64],
}

/// llama-quant.cpp's `tensor_category`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnKvB,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", AttnQkv),
        ("attn_kv_b.weight", AttnKvB),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    table
        .into_iter()
        .find(|(s, _)| name.contains(s))
        .map_or(Other, |(_, c)| c)
}

/// llama-quant.cpp's `use_more_bits`: the first and last eighth of `n` layers, and every
/// third one between.
fn more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// The layer of `blk.N.…` (llama.cpp's `sscanf(name, "blk.%d.")`).
pub fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// llama.cpp's tensor order (its loader's `weight_name_comparer`): by layer (tensors of no
/// layer first), then by name.
pub fn tensor_order(a: &str, b: &str) -> std::cmp::Ordering {
    let layer = |n: &str| layer_of(n).unwrap_or(-1);
    (layer(a), a).cmp(&(layer(b), b))
}

/// Dimensions counted as ggml counts them (`ggml_n_dims`: trailing 1s dropped).
fn n_dims(shape: &[u64]) -> usize {
    shape.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// Whether `t` is quantized at all (llama-quant.cpp `tensor_allows_quantization`): 2-D
/// and 3-D weights, except norms, the expert router, positional and token-type
/// embeddings, convolutions and the other small tables named there.
fn allows_quantization(arch: &str, t: &MixTensor<'_>, leave_output: bool) -> bool {
    let name = t.name;
    if n_dims(t.shape) < 2 || !name.ends_with("weight") {
        return false;
    }
    let excluded = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    if excluded.iter().any(|s| name.contains(s)) {
        return false;
    }
    let _ = arch; // (GLM5-next's exclusions: an architecture frink does not read)
    !(leave_output && name == "output.weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

/// The type selection over one model's tensors: counts what the rules count as it goes.
pub struct MixPlan<'a> {
    mix: Mix,
    opts: &'a MixOptions,
    model: &'a MixModel,
    tied: bool,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

/// Why a tensor cannot be made.
pub type MixError = String;

impl<'a> MixPlan<'a> {
    /// The plan for a model whose tensors are named `names` (all of them: the rules count
    /// the attention-V tensors and look for `output.weight`).
    pub fn new(mix: Mix, opts: &'a MixOptions, model: &'a MixModel, names: &[&str]) -> Self {
        MixPlan {
            mix,
            opts,
            model,
            tied: !names.contains(&"output.weight"),
            n_attention_wv: names.iter().filter(|n| is_attn_v(category(n))).count() as i64,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
        }
    }

    /// The type `t` gets (call in [`tensor_order`]), and the type the rules wanted when
    /// its rows are not whole blocks of that one and llama.cpp's fallback chose the first.
    ///
    /// Errors: a tensor that would need an importance matrix (a `Q2_K_S` mix's Q2_K
    /// tensors), or a layer the MoE rules cannot read from its name.
    pub fn type_of(&mut self, t: &MixTensor<'_>) -> Result<(GgmlType, Option<GgmlType>), MixError> {
        if !allows_quantization(&self.model.arch, t, self.opts.leave_output) {
            return Ok((t.ty, None));
        }
        let cat = category(t.name);
        let manual = self
            .opts
            .tensor_types
            .iter()
            .find(|(m, _)| m(t.name))
            .map(|(_, ty)| *ty);
        if let (Some(ty), Category::TokenEmbd) = (self.opts.token_embedding_type, cat) {
            if t.name != "per_layer_token_embd.weight" || manual.is_none() {
                return Ok((ty, None));
            }
        }
        if let (Some(ty), Category::Output) = (self.opts.output_type, cat) {
            return Ok((ty, None));
        }
        let mut ty = self.mix.default;
        if !ty.is_quantized() {
            return Ok((ty, None));
        }
        match manual {
            Some(m) => ty = m,
            None if !self.opts.pure => ty = self.rules(ty, t, cat)?,
            None => {}
        }
        let wanted = ty;
        let ty = fallback(t, ty);
        if self.requires_imatrix(t.name, ty) && !self.opts.has_imatrix {
            return Err(format!(
                "{}: its {ty} quantization in the {} mix needs an importance matrix \
                 (--imatrix FILE, made by frink imatrix or llama-imatrix)",
                t.name, self.mix.name
            ));
        }
        Ok((ty, (ty != wanted).then_some(wanted)))
    }

    /// Whether tensor `name` quantized to `ty` needs an importance matrix
    /// (llama-quant.cpp `tensor_requires_imatrix`: IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_M
    /// and IQ1_S tensors, and a `Q2_K_S` mix's Q2_K tensors, other than the output and
    /// token embeddings).
    pub fn requires_imatrix(&self, name: &str, ty: GgmlType) -> bool {
        use GgmlType as T;
        let needs = match ty {
            T::IQ3_XXS | T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ1_M | T::IQ1_S => true,
            T::Q2_K => self.mix.is("Q2_K_S"),
            _ => false,
        };
        needs && !matches!(category(name), Category::Output | Category::TokenEmbd)
    }

    /// `(layer, layers)` for the FFN rules: the count so far, or for a mixture of experts
    /// the layer in the name.
    fn layer_info(&self, i: i64, name: &str) -> Result<(i64, i64), MixError> {
        let n = i64::from(self.model.n_layer);
        if self.model.n_expert > 1 {
            let l = layer_of(name).ok_or_else(|| format!("cannot read the layer of {name}"))?;
            if !(0..n).contains(&l) {
                return Err(format!("layer {l} of {name} is not in 0..{n}"));
            }
            return Ok((l, n));
        }
        Ok((i, n))
    }

    /// llama-quant.cpp `llama_tensor_get_type_impl` for the mixes of [`MIXES`], branch by
    /// branch in its order.
    fn rules(
        &mut self,
        mut ty: GgmlType,
        t: &MixTensor<'_>,
        cat: Category,
    ) -> Result<GgmlType, MixError> {
        use Category::*;
        use GgmlType as T;
        let m = self.mix;
        let model = self.model;
        let falcon = model.arch == "falcon";
        if cat == Output || (self.tied && cat == TokenEmbd) {
            let tiny = [
                "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M",
            ];
            match self.opts.output_type {
                Some(o) => ty = o,
                None if m.is("MXFP4_MOE") => ty = T::Q8_0,
                None if falcon || !t.shape[0].is_multiple_of(ty.block_size() as u64) => {
                    ty = T::Q8_0
                }
                None if tiny.iter().any(|n| m.is(n)) => ty = T::Q5_K,
                None if ty != T::Q8_0 => ty = T::Q6_K,
                None => {}
            }
        } else if m.is("MXFP4_MOE") {
            // Experts (stacked, `ne2 > 1`) in MXFP4, the rest in Q8_0; bailingmoe3's MLA
            // projections are stacked too, so there only the FFN roles count.
            let ffn = matches!(cat, FfnUp | FfnGate | FfnDown);
            let experts = t.shape.get(2).is_some_and(|&n| n > 1);
            ty = if experts && (model.arch != "bailingmoe3" || ffn) {
                T::MXFP4
            } else {
                T::Q8_0
            };
        } else if cat == TokenEmbd {
            if let Some(e) = self.opts.token_embedding_type {
                ty = e;
            } else if ["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M"]
                .iter()
                .any(|n| m.is(n))
            {
                ty = T::Q2_K;
            } else if ["IQ2_S", "IQ2_M", "IQ3_XXS"].iter().any(|n| m.is(n)) {
                ty = T::IQ3_S;
            } else if m.is("TQ1_0") || m.is("TQ2_0") {
                ty = T::Q4_K;
            }
        } else if ["IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M"]
            .iter()
            .any(|n| m.is(n))
        {
            ty = self.two_bit_rules(ty, cat);
        } else if is_attn_v(cat) {
            ty = self.attn_v_type(ty);
        } else if cat == AttnK {
            if model.n_expert == 8 {
                ty = T::Q8_0;
            } else if m.is("IQ3_XS") {
                ty = T::IQ3_XXS;
            } else if m.is("IQ3_XXS") {
                ty = T::IQ2_S;
            }
        } else if cat == AttnQ {
            if m.is("IQ3_XS") {
                ty = T::IQ3_XXS;
            } else if m.is("IQ3_XXS") {
                ty = T::IQ2_S;
            }
        } else if cat == FfnDown {
            let (i, n) = self.layer_info(self.i_ffn_down, t.name)?;
            ty = self.ffn_down_type(ty, i, n);
            self.i_ffn_down += 1;
        } else if cat == AttnOutput {
            ty = self.attn_output_type(ty);
        } else if cat == AttnQkv {
            // (unreachable: attn_qkv is attention-V-like above, as in llama.cpp)
        } else if cat == FfnGate || cat == FfnUp {
            let counter = if cat == FfnGate {
                self.i_ffn_gate
            } else {
                self.i_ffn_up
            };
            let (i, n) = self.layer_info(counter, t.name)?;
            if m.is("IQ3_XS") && i >= n / 8 && i < 7 * n / 8 {
                ty = T::IQ3_XXS;
            }
            match cat {
                FfnGate => self.i_ffn_gate += 1,
                _ => self.i_ffn_up += 1,
            }
        }
        Ok(ty)
    }

    /// The 1- and 2-bit mixes' rules (IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, IQ1_S, IQ1_M): more
    /// bits for attention V, the first eighth of the FFN-down tensors (counted, not by
    /// layer) and the attention output.
    fn two_bit_rules(&mut self, mut ty: GgmlType, cat: Category) -> GgmlType {
        use GgmlType as T;
        let (m, model) = (self.mix, self.model);
        let s_or_m = m.is("IQ2_S") || m.is("IQ2_M");
        if is_attn_v(cat) {
            ty = if model.n_gqa >= 4 || model.n_expert >= 4 {
                T::Q4_K
            } else if s_or_m {
                T::IQ3_S
            } else {
                T::Q2_K
            };
            self.i_attention_wv += 1;
        } else if model.n_expert == 8 && cat == Category::AttnK {
            ty = T::Q4_K;
        } else if cat == Category::FfnDown {
            if self.i_ffn_down < i64::from(model.n_layer) / 8 {
                ty = if s_or_m { T::IQ3_S } else { T::Q2_K };
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if model.n_expert == 8 {
                ty = T::Q5_K;
            } else if m.is("IQ1_S") || m.is("IQ1_M") {
                ty = T::IQ2_XXS;
            } else if s_or_m {
                ty = T::IQ3_S;
            }
        }
        ty
    }

    /// Attention V (and the tensors llama.cpp counts with it).
    fn attn_v_type(&mut self, mut ty: GgmlType) -> GgmlType {
        use GgmlType as T;
        let (m, model) = (self.mix, self.model);
        let gqa4 = model.n_gqa >= 4;
        let i = self.i_attention_wv;
        if m.is("Q2_K") {
            ty = if gqa4 { T::Q4_K } else { T::Q3_K };
        } else if m.is("Q2_K_S") && gqa4 {
            ty = T::Q4_K;
        } else if m.is("IQ3_XXS") {
            ty = if gqa4 {
                T::Q4_K
            } else if !self.opts.has_imatrix {
                T::IQ3_S
            } else {
                T::IQ3_XXS
            };
        } else if ((m.is("IQ3_XS") || m.is("IQ3_S")) && gqa4) || m.is("IQ3_M") {
            ty = T::Q4_K;
        } else if m.is("Q3_K_M") {
            ty = if i < 2 { T::Q5_K } else { T::Q4_K };
        } else if m.is("Q3_K_L") || ((m.is("IQ4_NL") || m.is("IQ4_XS")) && gqa4) {
            ty = T::Q5_K;
        } else if (m.is("Q4_K_M") || m.is("Q5_K_M")) && more_bits(i, self.n_attention_wv) {
            ty = T::Q6_K;
        } else if m.is("Q4_K_S") && i < 4 {
            ty = T::Q5_K;
        }
        if model.is_70b && matches!(ty, T::Q3_K | T::Q4_K) {
            ty = T::Q5_K;
        }
        if model.n_expert == 8 {
            ty = T::Q8_0;
        }
        self.i_attention_wv += 1;
        ty
    }

    /// FFN down of layer `i` of `n`.
    fn ffn_down_type(&self, mut ty: GgmlType, i: i64, n: i64) -> GgmlType {
        use GgmlType as T;
        let m = self.mix;
        let falcon = self.model.arch == "falcon";
        let imatrix = self.opts.has_imatrix;
        if m.is("Q2_K") {
            ty = T::Q3_K;
        } else if m.is("Q2_K_S") {
            if i < n / 8 {
                ty = T::Q4_K;
            }
        } else if m.is("IQ3_XXS") && !imatrix {
            ty = if i < n / 8 { T::Q4_K } else { T::Q3_K };
        } else if m.is("Q3_K_M") {
            ty = if i < n / 16 {
                T::Q5_K
            } else if !falcon || more_bits(i, n) {
                T::Q4_K
            } else {
                T::Q3_K
            };
        } else if m.is("IQ3_M") && (i < n / 8 || (self.model.n_expert == 8 && more_bits(i, n))) {
            ty = T::Q4_K;
        } else if m.is("Q3_K_L") {
            ty = if falcon { T::Q4_K } else { T::Q5_K };
        } else if m.is("Q4_K_M") {
            if falcon {
                ty = if i < n / 16 {
                    T::Q6_K
                } else if more_bits(i, n) {
                    T::Q5_K
                } else {
                    T::Q4_K
                };
            } else if more_bits(i, n) {
                ty = T::Q6_K;
            }
        } else if i < n / 8 && (m.is("IQ4_NL") || m.is("IQ4_XS")) && !imatrix {
            ty = T::Q5_K;
        } else if m.is("Q5_K_M") && more_bits(i, n) {
            ty = T::Q6_K;
        } else if m.is("Q4_K_S") && !falcon && i < n / 8 {
            ty = T::Q5_K;
        } else if (m.is("Q4_0") || m.is("Q5_0")) && imatrix && i < n / 8 {
            ty = if m.is("Q4_0") { T::Q4_1 } else { T::Q5_1 };
        }
        ty
    }

    /// The attention output projection.
    fn attn_output_type(&self, mut ty: GgmlType) -> GgmlType {
        use GgmlType as T;
        let m = self.mix;
        if self.model.arch == "falcon" {
            if m.is("Q3_K_L") {
                ty = T::Q4_K;
            }
        } else if self.model.n_expert == 8 {
            let five = [
                "Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M",
                "IQ3_S", "IQ3_M", "IQ4_XS",
            ];
            if five.iter().any(|n| m.is(n)) {
                ty = T::Q5_K;
            }
        } else if m.is("Q2_K") {
            ty = T::Q3_K;
        } else if m.is("IQ3_XXS") {
            ty = T::IQ3_S;
        } else if m.is("Q3_K_M") || m.is("IQ3_M") {
            ty = T::Q4_K;
        } else if m.is("Q3_K_L") {
            ty = T::Q5_K;
        }
        ty
    }
}

/// llama-quant.cpp `tensor_type_fallback`: a type whose blocks do not divide the rows
/// gives way to one of 32-value blocks of about its size, and that to F16.
fn fallback(t: &MixTensor<'_>, ty: GgmlType) -> GgmlType {
    use GgmlType as T;
    let cols = t.shape[0];
    if cols.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let to = match ty {
        T::IQ1_S
        | T::IQ1_M
        | T::IQ2_XXS
        | T::IQ2_XS
        | T::IQ2_S
        | T::IQ3_XXS
        | T::IQ3_S
        | T::IQ4_XS => T::IQ4_NL,
        T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0 => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        other => other,
    };
    if cols.is_multiple_of(to.block_size() as u64) {
        to
    } else {
        T::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_order_follows_llama_cpp() {
        assert_eq!(Mix::parse("q4_k_m").unwrap().file_type, 15);
        assert_eq!(Mix::parse("iq2_m").unwrap().default, GgmlType::IQ2_S);
        assert!(Mix::parse("Q9").unwrap_err().contains("Q4_K_M"));
        let mut names = vec![
            "blk.10.ffn_up.weight",
            "output.weight",
            "blk.2.attn_v.weight",
            "blk.2.attn_k.weight",
            "token_embd.weight",
        ];
        names.sort_by(|a, b| tensor_order(a, b));
        assert_eq!(
            names,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.attn_k.weight",
                "blk.2.attn_v.weight",
                "blk.10.ffn_up.weight"
            ]
        );
        for m in MIXES {
            assert_eq!(
                frink_gguf::file_type_name(u64::from(m.file_type)),
                Some(m.name)
            );
        }
    }
}
