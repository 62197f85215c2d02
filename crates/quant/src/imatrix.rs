//! Importance matrices: per weight matrix, the sum of the squared activations entering
//! each of its columns (`llama-imatrix`'s statistics, read by `llama-quantize --imatrix`).
//!
//! Two file formats, both read and written:
//! - **GGUF** (llama.cpp's current one, tools/imatrix/imatrix.cpp `save_imatrix`):
//!   `general.type = "imatrix"`, `imatrix.datasets` (strings), `imatrix.chunk_count` and
//!   `imatrix.chunk_size` (u32); per matrix `NAME.in_sum2` (f32 `[cols, n_mat]`: Σ x² per
//!   column of each of its `n_mat` experts), `NAME.counts` (f32 `[1, n_mat]`: rows seen)
//!   and optionally `NAME.in_sum` (Σ x). llama.cpp also writes `NAME.stats`, a summary
//!   its quantizer does not read; frink neither writes nor needs it.
//! - **legacy `.dat`** (`save_imatrix_legacy`): little-endian `i32` entry count; per
//!   entry `i32` name length, the name, `i32` call count `ncall`, `i32` value count, the
//!   values (`Σ x² / rows · ncall`); then optionally `i32` chunk count, `i32` length and
//!   the dataset name.
//!
//! [`Imatrix::weights`] turns either into the per-column means llama-quantize passes to
//! the quantizers (tools/quantize/quantize.cpp `load_imatrix`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use frink_gguf::{GgmlType, GgufFile, GgufWriter, MetaArray, MetaValue};

/// `imatrix.datasets`: the text files the statistics came from.
pub const KEY_DATASETS: &str = "imatrix.datasets";
/// `imatrix.chunk_count`: chunks of `chunk_size` tokens evaluated.
pub const KEY_CHUNK_COUNT: &str = "imatrix.chunk_count";
/// `imatrix.chunk_size`: tokens per chunk.
pub const KEY_CHUNK_SIZE: &str = "imatrix.chunk_size";

/// The most matrices a file may describe (a model has some tens per layer: DeepSeek-V3's
/// 61 layers about 600); more is a damaged or hostile file, refused before its entries
/// are allocated.
pub const MAX_ENTRIES: usize = 1 << 16;

/// One matrix's statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entry {
    /// Σ x² per column: `counts.len()` matrices (experts) of `sums.len() / counts.len()`
    /// columns each. In a legacy file, already `Σ x² / rows · ncall`.
    pub sums: Vec<f32>,
    /// Rows seen per matrix; in a legacy file one value, the call count.
    pub counts: Vec<i64>,
    /// Σ x per column (GGUF `in_sum`), when recorded.
    pub activations: Option<Vec<f32>>,
}

impl Entry {
    /// A matrix of `n_mat` experts of `cols` columns with nothing seen.
    pub fn new(n_mat: usize, cols: usize) -> Entry {
        Entry {
            sums: vec![0.0; n_mat * cols],
            counts: vec![0; n_mat],
            activations: Some(vec![0.0; n_mat * cols]),
        }
    }

    /// Adds the rows `x` (each `cols` values) entering matrix (expert) `mat`:
    /// `sums += x²` and `activations += x` column by column, row after row (ggml's
    /// `acc[j] += x[j] * x[j]` order), and the row count.
    pub fn add_rows(&mut self, mat: usize, x: &[f32]) {
        let cols = self.sums.len() / self.counts.len().max(1);
        let acc = &mut self.sums[mat * cols..(mat + 1) * cols];
        for row in x.chunks_exact(cols) {
            for (a, &v) in acc.iter_mut().zip(row) {
                *a += v * v;
            }
        }
        if let Some(act) = &mut self.activations {
            let act = &mut act[mat * cols..(mat + 1) * cols];
            for row in x.chunks_exact(cols) {
                for (a, &v) in act.iter_mut().zip(row) {
                    *a += v;
                }
            }
        }
        self.counts[mat] += (x.len() / cols) as i64;
    }
}

/// A whole importance matrix.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    /// The matrices by tensor name (`blk.0.attn_q.weight`).
    pub entries: BTreeMap<String, Entry>,
    /// The text files it was computed on.
    pub datasets: Vec<String>,
    /// Chunks evaluated.
    pub chunk_count: u32,
    /// Tokens per chunk (0 in a legacy file).
    pub chunk_size: u32,
    /// Read from a legacy `.dat` file.
    pub legacy: bool,
}

/// A file that is not an importance matrix, or a damaged one.
#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    /// It cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Its contents are not an importance matrix of either format.
    #[error("{path}: not an importance matrix: {msg}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

impl Imatrix {
    /// Reads `path` in either format (GGUF when it starts with `GGUF`).
    ///
    /// # Errors
    /// [`ImatrixError::Io`], or [`ImatrixError::Format`] naming what is damaged: a GGUF
    /// that does not parse, a matrix with sums but no counts (or the reverse), non-f32
    /// statistics, sums that are not whole matrices, counts other than one per matrix of
    /// the sums' second dimension, more than [`MAX_ENTRIES`] matrices; a legacy file cut
    /// short or with negative or oversized lengths; anything but a regular file. A GGUF
    /// is mapped and its metadata checked first; a legacy file is read whole.
    pub fn read(path: impl AsRef<Path>) -> Result<Imatrix, ImatrixError> {
        use std::io::Read;
        let path = path.as_ref();
        let io = |source| ImatrixError::Io {
            path: path.to_path_buf(),
            source,
        };
        let format = |msg: String| ImatrixError::Format {
            path: path.to_path_buf(),
            msg,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(format("not a regular file".into()));
        }
        let mut magic = [0u8; 4];
        let n = std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut magic))
            .map_err(io)?;
        if n == 4 && &magic == b"GGUF" {
            // Mapped, not read: the metadata is checked before any tensor is touched (a
            // model given by mistake costs no more than its header).
            let file = GgufFile::open(path).map_err(|e| format(e.to_string()))?;
            Self::from_gguf(&file).map_err(format)
        } else {
            let bytes = std::fs::read(path).map_err(io)?;
            Self::from_legacy(&bytes).map_err(format)
        }
    }

    /// The statistics of a parsed GGUF imatrix (common/imatrix-loader.cpp).
    ///
    /// # Errors
    /// As [`Imatrix::read`], as a message.
    pub fn from_gguf(file: &GgufFile) -> Result<Imatrix, String> {
        let mut m = Imatrix::default();
        if let Some(MetaValue::Array(MetaArray::String(d))) = file.get(KEY_DATASETS) {
            m.datasets = d.clone();
        }
        let u32_of = |k: &str| file.get(k).and_then(MetaValue::as_u32);
        let (count, size) = (u32_of(KEY_CHUNK_COUNT), u32_of(KEY_CHUNK_SIZE));
        if count.is_none() || size.is_none() || file.get(KEY_DATASETS).is_none() {
            return Err(format!(
                "the GGUF lacks {KEY_DATASETS}, {KEY_CHUNK_COUNT} or {KEY_CHUNK_SIZE} \
                 (llama-quantize refuses it too)"
            ));
        }
        (m.chunk_count, m.chunk_size) = (count.unwrap_or(0), size.unwrap_or(0));
        let floats = |name: &str| -> Result<Option<Vec<f32>>, String> {
            let Some(t) = file.tensor(name) else {
                return Ok(None);
            };
            if t.info.ggml_type != GgmlType::F32 {
                return Err(format!("{name} is {}, not F32", t.info.ggml_type));
            }
            Ok(Some(
                t.data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ))
        };
        let mut names: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        for t in file.tensor_infos() {
            let base = t
                .name
                .strip_suffix(".in_sum2")
                .or_else(|| t.name.strip_suffix(".counts"));
            if let Some(b) = base.filter(|b| !b.is_empty()) {
                names.insert(b);
            }
        }
        if names.len() > MAX_ENTRIES {
            return Err(format!(
                "{} matrices: more than the {MAX_ENTRIES} any model has",
                names.len()
            ));
        }
        for name in names {
            let sums = floats(&format!("{name}.in_sum2"))?;
            let counts = floats(&format!("{name}.counts"))?;
            let (Some(sums), Some(counts)) = (sums, counts) else {
                return Err(format!(
                    "{name}: sums (.in_sum2) and counts (.counts) do not pair"
                ));
            };
            let n_mat = file
                .tensor(&format!("{name}.in_sum2"))
                .map_or(1, |t| t.info.shape.get(1).copied().unwrap_or(1) as usize);
            if counts.is_empty()
                || counts.len() != n_mat
                || !sums.len().is_multiple_of(counts.len())
            {
                return Err(format!(
                    "{name}: {} sums are not whole matrices for {} counts",
                    sums.len(),
                    counts.len()
                ));
            }
            let activations = floats(&format!("{name}.in_sum"))?.filter(|a| a.len() == sums.len());
            let counts = counts.iter().map(|&c| c.round() as i64).collect();
            m.entries.insert(
                name.to_string(),
                Entry {
                    sums,
                    counts,
                    activations,
                },
            );
        }
        if m.entries.is_empty() {
            return Err("no .in_sum2/.counts tensors".into());
        }
        Ok(m)
    }

    /// The statistics of a legacy `.dat` image.
    ///
    /// # Errors
    /// As [`Imatrix::read`], as a message.
    pub fn from_legacy(bytes: &[u8]) -> Result<Imatrix, String> {
        let mut at = 0usize;
        let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
            let end = at
                .checked_add(n)
                .filter(|&e| e <= bytes.len())
                .ok_or_else(|| format!("cut short reading {what} at byte {at}"))?;
            let s = &bytes[at..end];
            at = end;
            Ok(s)
        };
        let int = |b: &[u8]| i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let n_entries = int(take(4, "the entry count")?);
        if n_entries < 1 || n_entries as usize > MAX_ENTRIES {
            return Err(format!("entry count {n_entries} (1 to {MAX_ENTRIES})"));
        }
        let mut m = Imatrix {
            legacy: true,
            ..Imatrix::default()
        };
        for i in 0..n_entries {
            let len = int(take(4, "a name length")?);
            let len = usize::try_from(len).map_err(|_| format!("entry {i}: name length {len}"))?;
            let name = String::from_utf8_lossy(take(len, "a name")?).into_owned();
            let ncall = int(take(4, "a call count")?);
            let nval = int(take(4, "a value count")?);
            let nval = usize::try_from(nval)
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| format!("{name}: value count {nval}"))?;
            let raw = take(nval.saturating_mul(4), "values")?;
            let sums = raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            m.entries.insert(
                name,
                Entry {
                    sums,
                    counts: vec![i64::from(ncall)],
                    activations: None,
                },
            );
        }
        if let Ok(b) = take(4, "the chunk count") {
            m.chunk_count = u32::try_from(int(b)).unwrap_or(0);
            if let Ok(b) = take(4, "the dataset length") {
                let len = usize::try_from(int(b)).unwrap_or(0);
                if let Ok(d) = take(len, "the dataset") {
                    if len > 0 {
                        m.datasets.push(String::from_utf8_lossy(d).into_owned());
                    }
                }
            }
        }
        Ok(m)
    }

    /// The per-column importance of each matrix, as llama-quantize computes it from the
    /// file (tools/quantize/quantize.cpp `load_imatrix`): GGUF sums divided by each
    /// expert's row count (1 for an expert never seen), legacy values divided by their
    /// call count. `[n_mat][cols]` per name.
    ///
    /// # Errors
    /// A value that is not finite, named (llama-quant.cpp refuses it too).
    pub fn weights(&self) -> Result<BTreeMap<String, Vec<f32>>, String> {
        let mut out = BTreeMap::new();
        for (name, e) in &self.entries {
            let mut w = e.sums.clone();
            if self.legacy {
                let ncall = e.counts.first().copied().unwrap_or(0);
                if ncall > 0 {
                    w.iter_mut().for_each(|v| *v /= ncall as f32);
                }
            } else {
                let cols = w.len() / e.counts.len().max(1);
                for (chunk, &c) in w.chunks_mut(cols.max(1)).zip(&e.counts) {
                    if c > 0 {
                        chunk.iter_mut().for_each(|v| *v /= c as f32);
                    } else {
                        chunk.fill(1.0);
                    }
                }
            }
            if let Some(v) = w.iter().find(|v| !v.is_finite()) {
                return Err(format!("{name}: the importance matrix holds {v}"));
            }
            out.insert(name.clone(), w);
        }
        Ok(out)
    }

    /// The GGUF image (llama.cpp's `save_imatrix`, without its `.stats` summaries).
    ///
    /// # Errors
    /// A matrix whose sums are not whole matrices for its counts.
    pub fn to_gguf(&self) -> Result<GgufWriter, String> {
        let mut w = GgufWriter::new();
        w.add_metadata("general.type", MetaValue::String("imatrix".into()));
        w.add_metadata(
            KEY_DATASETS,
            MetaValue::Array(MetaArray::String(self.datasets.clone())),
        );
        w.add_metadata(KEY_CHUNK_COUNT, MetaValue::U32(self.chunk_count));
        w.add_metadata(KEY_CHUNK_SIZE, MetaValue::U32(self.chunk_size));
        let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for (name, e) in &self.entries {
            let n_mat = e.counts.len();
            if n_mat == 0 || e.sums.is_empty() || !e.sums.len().is_multiple_of(n_mat) {
                return Err(format!("{name}: {} sums for {n_mat} counts", e.sums.len()));
            }
            let shape = |cols: usize| -> Vec<u64> {
                if n_mat > 1 {
                    vec![cols as u64, n_mat as u64]
                } else {
                    vec![cols as u64]
                }
            };
            let cols = e.sums.len() / n_mat;
            let counts: Vec<f32> = e.counts.iter().map(|&c| c as f32).collect();
            let err = |e: frink_gguf::GgufError| e.to_string();
            w.add_tensor(
                format!("{name}.in_sum2"),
                GgmlType::F32,
                &shape(cols),
                le(&e.sums),
            )
            .map_err(err)?;
            w.add_tensor(
                format!("{name}.counts"),
                GgmlType::F32,
                &shape(1),
                le(&counts),
            )
            .map_err(err)?;
            if let Some(a) = e.activations.as_ref().filter(|a| a.len() == e.sums.len()) {
                w.add_tensor(format!("{name}.in_sum"), GgmlType::F32, &shape(cols), le(a))
                    .map_err(err)?;
            }
        }
        Ok(w)
    }

    /// The legacy `.dat` image (llama.cpp's `save_imatrix_legacy`): matrices never seen
    /// are left out, each entry's call count is its most-seen expert's rows in whole
    /// chunks (rounded up), its values `Σ x² / rows · ncall` (1 for an unseen expert).
    pub fn to_legacy(&self) -> Vec<u8> {
        let chunk = i64::from(self.chunk_size.max(1));
        let mut out = Vec::new();
        let kept: Vec<(&String, &Entry)> = self
            .entries
            .iter()
            .filter(|(_, e)| e.counts.iter().any(|&c| c != 0))
            .collect();
        out.extend((kept.len() as i32).to_le_bytes());
        for (name, e) in kept {
            out.extend((name.len() as i32).to_le_bytes());
            out.extend(name.as_bytes());
            let max = e.counts.iter().copied().max().unwrap_or(0);
            let ncall = ((max + chunk - 1) / chunk) as i32;
            out.extend(ncall.to_le_bytes());
            out.extend((e.sums.len() as i32).to_le_bytes());
            let per = e.sums.len() / e.counts.len().max(1);
            for (i, &v) in e.sums.iter().enumerate() {
                let c = e.counts[i / per.max(1)];
                let (v, c) = if c == 0 { (1.0, 1.0) } else { (v, c as f32) };
                out.extend((v / c * ncall as f32).to_le_bytes());
            }
        }
        out.extend((self.chunk_count as i32).to_le_bytes());
        let dataset = self.datasets.last().map(String::as_str).unwrap_or("");
        out.extend((dataset.len() as i32).to_le_bytes());
        out.extend(dataset.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut dense = Entry::new(1, 4);
        dense.add_rows(0, &[1.0, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0]);
        let mut experts = Entry::new(3, 2);
        experts.add_rows(0, &[1.0, 1.0]);
        experts.add_rows(2, &[2.0, -3.0, 1.0, 1.0]);
        Imatrix {
            entries: BTreeMap::from([
                ("blk.0.attn_q.weight".to_string(), dense),
                ("blk.0.ffn_up_exps.weight".to_string(), experts),
            ]),
            datasets: vec!["wiki.txt".into()],
            chunk_count: 1,
            chunk_size: 2,
            legacy: false,
        }
    }

    /// Both formats round-trip, give llama-quantize's normalized weights, and damaged
    /// legacy files are errors at every cut.
    #[test]
    fn formats_round_trip_and_damage_is_refused() {
        let m = sample();
        let e = &m.entries["blk.0.attn_q.weight"];
        assert_eq!(e.sums, [2.0, 4.25, 9.0, 20.0]);
        assert_eq!(e.counts, [2]);
        let w = m.weights().unwrap();
        assert_eq!(w["blk.0.attn_q.weight"], [1.0, 2.125, 4.5, 10.0]);
        // Expert 1 unseen: weight 1.
        assert_eq!(
            w["blk.0.ffn_up_exps.weight"],
            [1.0, 1.0, 1.0, 1.0, 2.5, 5.0]
        );
        let g = GgufFile::from_bytes(m.to_gguf().unwrap().to_bytes().unwrap()).unwrap();
        assert_eq!(Imatrix::from_gguf(&g).unwrap(), m);
        let dat = m.to_legacy();
        let back = Imatrix::from_legacy(&dat).unwrap();
        assert!(back.legacy);
        assert_eq!(back.datasets, ["wiki.txt"]);
        assert_eq!(back.chunk_count, 1);
        // The legacy file stores means times the call count: the weights agree.
        assert_eq!(back.weights().unwrap(), w);
        for cut in 0..dat.len() {
            if let Ok(m) = Imatrix::from_legacy(&dat[..cut]) {
                // Only the optional trailer may be missing.
                assert_eq!(m.entries.len(), 2, "cut at {cut}");
            }
        }
        let mut huge = dat.clone();
        huge[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(Imatrix::from_legacy(&huge).is_err());
        let mut nan = m.clone();
        nan.entries.get_mut("blk.0.attn_q.weight").unwrap().sums[1] = f32::NAN;
        assert!(nan.weights().unwrap_err().contains("attn_q"));
    }
}
