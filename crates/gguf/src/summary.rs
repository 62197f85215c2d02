//! What a model file is, in the words people use for it: the quantization mix named by
//! `general.file_type` (llama.cpp's `enum llama_ftype`), the parameter count, and sizes
//! written as `135.0M` parameters or `98.4 MB` on disk.

use crate::GgufFile;

/// The name of a `general.file_type` value: llama.cpp's `enum llama_ftype`
/// (include/llama.h, `LLAMA_FTYPE_MOSTLY_*`), e.g. 15 → `Q4_K_M`. `None` for values that
/// enum does not have (4–6 and 33–35 were retired there).
pub fn file_type_name(t: u64) -> Option<&'static str> {
    Some(match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        19 => "IQ2_XXS",
        20 => "IQ2_XS",
        21 => "Q2_K_S",
        22 => "IQ3_XS",
        23 => "IQ3_XXS",
        24 => "IQ1_S",
        25 => "IQ4_NL",
        26 => "IQ3_S",
        27 => "IQ3_M",
        28 => "IQ2_S",
        29 => "IQ2_M",
        30 => "IQ4_XS",
        31 => "IQ1_M",
        32 => "BF16",
        36 => "TQ1_0",
        37 => "TQ2_0",
        38 => "MXFP4_MOE",
        _ => return None,
    })
}

/// `n` parameters as Ollama writes them (`135.0M`, `1.5B`).
pub fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

/// `bytes` in decimal units as `ollama list` and `ls -h --si` write them: `0 B`, `812 B`,
/// `98 MB`, `1.5 GB` (one decimal below 10 of a unit, none above).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KB", "MB", "GB", "TB", "PB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1000.0 {
            break;
        }
        v /= 1000.0;
        unit = u;
    }
    if v < 9.95 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

impl GgufFile {
    /// The number of weights in the file: the sum of every tensor's element count.
    pub fn parameter_count(&self) -> u64 {
        self.tensor_infos().iter().map(|t| t.n_elements()).sum()
    }

    /// The quantization mix `general.file_type` names (`Q4_K_M`), `None` when the key is
    /// absent or holds a value llama.cpp's enum does not have.
    pub fn file_type_name(&self) -> Option<&'static str> {
        file_type_name(self.get("general.file_type")?.as_u64()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1000), "1.0 KB");
        assert_eq!(human_bytes(98_362_432), "98 MB");
        assert_eq!(human_bytes(491_400_064), "491 MB");
        assert_eq!(human_bytes(4_920_000_000), "4.9 GB");
        assert_eq!(human_bytes(9_990_000_000), "10 GB");
        assert_eq!(human_bytes(u64::MAX), "18447 PB");
        assert_eq!(parameter_size(134_515_008), "134.5M");
        assert_eq!(parameter_size(1_543_714_304), "1.5B");
        assert_eq!(file_type_name(15), Some("Q4_K_M"));
        assert_eq!(file_type_name(4), None);
    }
}
