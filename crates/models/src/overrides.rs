//! Metadata overrides: llama.cpp's `--override-kv KEY=TYPE:VALUE` and its RoPE flags
//! (`--rope-scaling`, `--rope-freq-base`, `--yarn-orig-ctx`, …), applied to a file's
//! metadata in memory before anything reads it, so that the result is validated exactly
//! as if the file held it ([`crate::ModelConfig::from_gguf`], the tokenizer).
//!
//! The flags' meanings are llama.cpp's `common/arg.cpp` and `src/llama-context.cpp`
//! (`--rope-scale N` is a frequency scale of `1/N`; the YaRN parameters are those of the
//! `{arch}.rope.scaling.*` keys). They are written as the keys llama.cpp's converter
//! writes (gguf-py `constants.py`, `Keys.Rope`), which is what makes "the same change
//! written into the file" and the override give the same logits.

use frink_gguf::{GgufFile, MetaValue, ValueType};

use crate::error::{ModelError, Result};

/// `x` as an error shows it: plainly, or in exponent form when very large or small.
pub(crate) fn show(x: f32) -> String {
    let a = x.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// Longest string value an override may carry (llama.cpp's `val_str` holds 127 bytes;
/// frink allows more, but not an unbounded argument).
pub const MAX_OVERRIDE_STR: usize = 4096;

/// One metadata key set to one value, as `--override-kv KEY=TYPE:VALUE` gives it.
#[derive(Clone, Debug, PartialEq)]
pub struct MetaOverride {
    /// The full key (`tokenizer.ggml.add_bos_token`, `llama.rope.freq_base`).
    pub key: String,
    /// The value, of llama.cpp's override types: an integer (`I64`), a float (`F64`), a
    /// bool or a string; [`apply`] stores it in the type the file already uses for the key.
    pub value: MetaValue,
    /// What asked for it (`--override-kv llama.rope.freq_base=float:5e5`,
    /// `--rope-freq-base 500000`): named by every error about it.
    pub source: String,
}

impl std::str::FromStr for MetaOverride {
    type Err = String;

    /// Parses `KEY=TYPE:VALUE` with TYPE one of `int`, `float`, `bool`, `str` (llama.cpp
    /// `common/common.cpp` `string_parse_kv_override`; `bool` takes `true` or `false`).
    fn from_str(s: &str) -> std::result::Result<MetaOverride, String> {
        let (key, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected KEY=TYPE:VALUE"))?;
        if key.is_empty() || key.len() > 127 || key.chars().any(|c| c.is_control()) {
            return Err(format!(
                "{s:?}: the key must be 1 to 127 printable characters"
            ));
        }
        let (ty, val) = rest
            .split_once(':')
            .ok_or_else(|| format!("{s:?}: expected KEY=TYPE:VALUE"))?;
        let bad = |what: &str| format!("{s:?}: {val:?} is not {what}");
        let value = match ty {
            "int" => MetaValue::I64(val.trim().parse().map_err(|_| bad("an integer"))?),
            "float" => {
                let v: f64 = val.trim().parse().map_err(|_| bad("a number"))?;
                if !v.is_finite() {
                    return Err(bad("a finite number"));
                }
                MetaValue::F64(v)
            }
            "bool" => MetaValue::Bool(match val {
                "true" => true,
                "false" => false,
                _ => return Err(bad("true or false")),
            }),
            "str" if val.len() > MAX_OVERRIDE_STR => {
                return Err(format!(
                    "{key}: a string of {} bytes (at most {MAX_OVERRIDE_STR})",
                    val.len()
                ))
            }
            "str" => MetaValue::String(val.to_string()),
            _ => return Err(format!("{s:?}: type {ty:?} is not int, float, bool or str")),
        };
        Ok(MetaOverride {
            key: key.to_string(),
            value,
            source: format!("--override-kv {s}"),
        })
    }
}

/// RoPE scaling as `--rope-scaling` names it (llama.cpp `LLAMA_ROPE_SCALING_TYPE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeScaling {
    /// No scaling.
    None,
    /// Positions divided by the factor.
    Linear,
    /// YaRN (Peng et al. 2023).
    Yarn,
}

impl RopeScaling {
    /// The name the flag and the `{arch}.rope.scaling.type` key use.
    pub fn name(self) -> &'static str {
        match self {
            RopeScaling::None => "none",
            RopeScaling::Linear => "linear",
            RopeScaling::Yarn => "yarn",
        }
    }
}

impl std::str::FromStr for RopeScaling {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<RopeScaling, String> {
        [RopeScaling::None, RopeScaling::Linear, RopeScaling::Yarn]
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| format!("{s:?}: expected none, linear or yarn"))
    }
}

/// llama.cpp's RoPE flags; `None` keeps the file's value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RopeOverrides {
    /// `--rope-scaling`: `{arch}.rope.scaling.type`.
    pub scaling: Option<RopeScaling>,
    /// `--rope-scale N`: the context is stretched N times (`{arch}.rope.scaling.factor` = N).
    pub scale: Option<f32>,
    /// `--rope-freq-base`: `{arch}.rope.freq_base`.
    pub freq_base: Option<f32>,
    /// `--rope-freq-scale F`: positions multiplied by F (`{arch}.rope.scaling.factor` = 1/F).
    pub freq_scale: Option<f32>,
    /// `--yarn-orig-ctx`: `{arch}.rope.scaling.original_context_length`.
    pub yarn_orig_ctx: Option<u32>,
    /// `--yarn-ext-factor`: `{arch}.rope.scaling.yarn_ext_factor`.
    pub yarn_ext_factor: Option<f32>,
    /// `--yarn-attn-factor`: `{arch}.rope.scaling.yarn_attn_factor`.
    pub yarn_attn_factor: Option<f32>,
    /// `--yarn-beta-fast`: `{arch}.rope.scaling.yarn_beta_fast`.
    pub yarn_beta_fast: Option<f32>,
    /// `--yarn-beta-slow`: `{arch}.rope.scaling.yarn_beta_slow`.
    pub yarn_beta_slow: Option<f32>,
}

impl RopeOverrides {
    /// Whether any flag is set.
    pub fn any(&self) -> bool {
        *self != RopeOverrides::default()
    }

    /// The keys these flags set for architecture `arch` (the `general.architecture` value).
    ///
    /// Errors: `--rope-scale` with `--rope-freq-scale` (both set the factor), or a scale
    /// that is not a positive finite number (named by its flag).
    pub fn to_overrides(&self, arch: &str) -> std::result::Result<Vec<MetaOverride>, String> {
        let mut out = Vec::new();
        let mut push = |suffix: &str, value: MetaValue, source: String| {
            out.push(MetaOverride {
                key: format!("{arch}.{suffix}"),
                value,
                source,
            })
        };
        if let Some(s) = self.scaling {
            let src = format!("--rope-scaling {}", s.name());
            push("rope.scaling.type", MetaValue::String(s.name().into()), src);
        }
        let factor = match (self.scale, self.freq_scale) {
            (Some(_), Some(_)) => {
                return Err(
                    "--rope-scale and --rope-freq-scale both set the scaling factor \
                            (one is the inverse of the other): give one"
                        .into(),
                )
            }
            (Some(n), None) => Some((n, format!("--rope-scale {}", show(n)))),
            (None, Some(f)) if f.is_finite() && f > 0.0 => {
                Some((1.0 / f, format!("--rope-freq-scale {}", show(f))))
            }
            (None, Some(f)) => {
                return Err(format!("--rope-freq-scale {f}: must be a positive number"))
            }
            (None, None) => None,
        };
        if let Some((n, src)) = factor {
            if !(n.is_finite() && n > 0.0) {
                return Err(format!("{src}: must be a positive number"));
            }
            push("rope.scaling.factor", MetaValue::F32(n), src);
        }
        let floats = [
            ("rope.freq_base", self.freq_base, "--rope-freq-base"),
            (
                "rope.scaling.yarn_ext_factor",
                self.yarn_ext_factor,
                "--yarn-ext-factor",
            ),
            (
                "rope.scaling.yarn_attn_factor",
                self.yarn_attn_factor,
                "--yarn-attn-factor",
            ),
            (
                "rope.scaling.yarn_beta_fast",
                self.yarn_beta_fast,
                "--yarn-beta-fast",
            ),
            (
                "rope.scaling.yarn_beta_slow",
                self.yarn_beta_slow,
                "--yarn-beta-slow",
            ),
        ];
        for (suffix, v, flag) in floats {
            if let Some(v) = v {
                if !v.is_finite() {
                    return Err(format!("{flag} {v}: must be a finite number"));
                }
                push(suffix, MetaValue::F32(v), format!("{flag} {}", show(v)));
            }
        }
        if let Some(n) = self.yarn_orig_ctx {
            push(
                "rope.scaling.original_context_length",
                MetaValue::U32(n),
                format!("--yarn-orig-ctx {n}"),
            );
        }
        Ok(out)
    }
}

/// The kind of value an override may replace: a file's integer key takes an integer, a
/// float key a float, and so on (llama.cpp `llama_model_loader` `validate_override`).
fn kind(t: ValueType) -> &'static str {
    match t {
        ValueType::F32 | ValueType::F64 => "float",
        ValueType::Bool => "bool",
        ValueType::String => "str",
        ValueType::Array => "array",
        _ => "int",
    }
}

/// A kind with its article, as an error names it.
fn article(kind: &str) -> &'static str {
    match kind {
        "float" => "a float",
        "bool" => "a bool",
        "str" => "a string",
        "array" => "an array",
        _ => "an integer",
    }
}

/// `value` stored as the file's type `t` (an integer kept in the file's width, a float in
/// its precision), or why it cannot be.
fn as_type(value: &MetaValue, t: ValueType) -> std::result::Result<MetaValue, String> {
    let (have, want) = (kind(value.value_type()), kind(t));
    if have != want {
        return Err(format!(
            "the file holds {} there, not {}",
            article(want),
            article(have)
        ));
    }
    let range = |v: i64| format!("{v} does not fit the file's {}", t.name());
    let int = |v: i64| -> std::result::Result<MetaValue, String> {
        Ok(match t {
            ValueType::U8 => MetaValue::U8(v.try_into().map_err(|_| range(v))?),
            ValueType::I8 => MetaValue::I8(v.try_into().map_err(|_| range(v))?),
            ValueType::U16 => MetaValue::U16(v.try_into().map_err(|_| range(v))?),
            ValueType::I16 => MetaValue::I16(v.try_into().map_err(|_| range(v))?),
            ValueType::U32 => MetaValue::U32(v.try_into().map_err(|_| range(v))?),
            ValueType::I32 => MetaValue::I32(v.try_into().map_err(|_| range(v))?),
            ValueType::U64 => MetaValue::U64(v.try_into().map_err(|_| range(v))?),
            _ => MetaValue::I64(v),
        })
    };
    Ok(match (value, t) {
        (v, _) if want == "int" => int(v.as_i64().ok_or("an integer beyond i64")?)?,
        (MetaValue::F64(v), ValueType::F32) => MetaValue::F32(*v as f32),
        (MetaValue::F32(v), ValueType::F64) => MetaValue::F64(f64::from(*v)),
        (v, _) => v.clone(),
    })
}

/// Applies `overrides` to `file`'s metadata in memory, in order (a later one for the same
/// key wins, as on llama.cpp's command line). A key the file has keeps its type: an
/// integer override of a `u32` key is stored as `u32`, range-checked.
///
/// Errors: [`ModelError::Metadata`] naming the key and the flag when the value's kind
/// (int, float, bool, str) differs from the file's, or does not fit its integer type;
/// an array key cannot be overridden (llama.cpp has no array overrides).
pub fn apply(file: &mut GgufFile, overrides: &[MetaOverride]) -> Result<()> {
    for o in overrides {
        let value = match file.get(&o.key) {
            Some(old) => {
                as_type(&o.value, old.value_type()).map_err(|detail| ModelError::Metadata {
                    key: o.key.clone(),
                    detail: format!("overridden: {detail}"),
                })?
            }
            None => o.value.clone(),
        };
        file.set_metadata(&o.key, value);
    }
    // `rope.scale_linear` (older converters' linear factor) would override a new factor.
    if let Some(arch) = file.architecture().map(str::to_string) {
        let factor = format!("{arch}.rope.scaling.factor");
        if overrides.iter().any(|o| o.key == factor) {
            file.remove_metadata(&format!("{arch}.rope.scale_linear"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_cpp_form() {
        let o: MetaOverride = "tokenizer.ggml.add_bos_token=bool:false".parse().unwrap();
        assert_eq!(o.key, "tokenizer.ggml.add_bos_token");
        assert_eq!(o.value, MetaValue::Bool(false));
        let o: MetaOverride = "llama.rope.freq_base=float:5e5".parse().unwrap();
        assert_eq!(o.value, MetaValue::F64(5e5));
        let o: MetaOverride = "llama.context_length=int:8192".parse().unwrap();
        assert_eq!(o.value, MetaValue::I64(8192));
        let o: MetaOverride = "general.name=str:a=b:c".parse().unwrap();
        assert_eq!(o.value, MetaValue::String("a=b:c".into()));
        for bad in [
            "nokey",
            "=int:1",
            "k=int",
            "k=int:x",
            "k=float:nan",
            "k=float:inf",
            "k=bool:yes",
            "k=u32:1",
            "k=int:99999999999999999999",
        ] {
            assert!(bad.parse::<MetaOverride>().is_err(), "{bad}");
        }
        let long = format!("k=str:{}", "x".repeat(MAX_OVERRIDE_STR + 1));
        assert!(long.parse::<MetaOverride>().is_err());
    }

    #[test]
    fn keeps_the_file_type_and_refuses_other_kinds() {
        let int = MetaValue::I64(7);
        assert_eq!(as_type(&int, ValueType::U32), Ok(MetaValue::U32(7)));
        assert!(as_type(&MetaValue::I64(-1), ValueType::U32).is_err());
        assert!(as_type(&MetaValue::I64(1 << 40), ValueType::U32).is_err());
        assert_eq!(
            as_type(&MetaValue::F64(0.5), ValueType::F32),
            Ok(MetaValue::F32(0.5))
        );
        assert!(as_type(&int, ValueType::F32).is_err());
        assert!(as_type(&MetaValue::Bool(true), ValueType::String).is_err());
        assert!(as_type(&MetaValue::String("x".into()), ValueType::Array).is_err());
        assert_eq!(
            as_type(&MetaValue::U32(3), ValueType::U8),
            Ok(MetaValue::U8(3))
        );
    }

    #[test]
    fn rope_flags_name_their_keys() {
        let r = RopeOverrides {
            scaling: Some(RopeScaling::Yarn),
            freq_scale: Some(0.25),
            yarn_orig_ctx: Some(4096),
            freq_base: Some(5e5),
            ..Default::default()
        };
        let o = r.to_overrides("llama").unwrap();
        let keys: Vec<&str> = o.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "llama.rope.scaling.type",
                "llama.rope.scaling.factor",
                "llama.rope.freq_base",
                "llama.rope.scaling.original_context_length"
            ]
        );
        assert_eq!(o[1].value, MetaValue::F32(4.0));
        let both = RopeOverrides {
            scale: Some(2.0),
            freq_scale: Some(0.5),
            ..Default::default()
        };
        assert!(both.to_overrides("llama").is_err());
        for bad in [0.0, -1.0, f32::NAN] {
            let r = RopeOverrides {
                scale: Some(bad),
                ..Default::default()
            };
            assert!(r.to_overrides("llama").is_err(), "{bad}");
        }
        assert!(!RopeOverrides::default().any());
    }
}
