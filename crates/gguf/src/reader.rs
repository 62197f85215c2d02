//! The GGUF reader: parses the header, metadata and tensor infos of a GGUF v2/v3 file and
//! hands out tensor data as slices of the mapped file.
//!
//! Layout (GGUF specification, ggml `docs/gguf.md`; ggml `src/gguf.cpp`): magic `GGUF`,
//! u32 version, u64 tensor count, u64 metadata count, the metadata key/value pairs, the
//! tensor infos (name, u32 n_dims, u64 dims ne0 first, u32 ggml type, u64 offset relative to
//! the data section), padding to `general.alignment` (default 32), then the data section.
//! All integers are little-endian.
//!
//! Nothing read from the file is trusted: every length and count is checked against the
//! bytes that remain before anything is allocated, shapes are checked for overflow and for
//! whole blocks, and every tensor's data must lie inside the file, aligned, and must not
//! overlap another tensor's.

use std::collections::HashMap;
use std::path::Path;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use crate::value::{MetaArray, MetaValue, ValueType};

/// `general.alignment` when the key is absent (`GGUF_DEFAULT_ALIGNMENT` in gguf.h).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor has (`GGML_MAX_DIMS` in ggml.h).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays accepted. The specification puts no bound on it; a
/// bound keeps a hostile file from exhausting the stack with arrays of arrays.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Where a tensor's data lives and how to interpret it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name as llama.cpp spells it (`blk.0.attn_q.weight`).
    pub name: String,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Dimensions, ne0 (the contiguous, row) dimension first, as GGUF stores them.
    pub shape: Vec<u64>,
    /// Offset of the data from the start of the data section, in bytes.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
    /// Byte offset in the file where this tensor's info record starts (for diagnostics).
    pub info_offset: u64,
}

impl TensorInfo {
    /// Number of elements (product of the shape).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Elements per row (`ne0`).
    pub fn row_len(&self) -> u64 {
        self.shape[0]
    }

    /// Number of rows (product of the dimensions after the first).
    pub fn n_rows(&self) -> u64 {
        self.shape[1..].iter().product()
    }
}

/// A tensor's info together with its bytes in the file.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub info: &'a TensorInfo,
    /// Exactly `info.n_bytes` bytes, in the stored format.
    pub data: &'a [u8],
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file. Tensor data stays in the mapping (or buffer) until used.
pub struct GgufFile {
    backing: Backing,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    /// The other files of a split model (shards 2 … N), whose tensors are listed in
    /// `tensors` after this file's own.
    shards: Vec<GgufFile>,
    /// For each tensor of `tensors`, the file holding its data: 0 this one, k `shards[k-1]`
    /// (empty: all here).
    tensor_shard: Vec<usize>,
    /// Every key [`GgufFile::get`] was asked for, present or not: which metadata the
    /// engine reads ([`GgufFile::keys_looked_up`]).
    looked_up: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// The most shards a split model may have.
const MAX_SHARDS: usize = 4096;

/// Shard `no` (1-based) of `count` of the split model whose first shard is `first`:
/// `prefix-NNNNN-of-MMMMM.gguf`, llama.cpp's split file names (`llama_split_path`,
/// src/llama.cpp: `"%s-%05d-of-%05d.gguf"`), or `None` when `first` is not named so.
fn split_path(first: &Path, no: usize, count: usize) -> Option<std::path::PathBuf> {
    let name = first.file_name()?.to_str()?;
    let suffix = format!("-00001-of-{count:05}.gguf");
    let prefix = name.strip_suffix(&suffix)?;
    Some(first.with_file_name(format!("{prefix}-{no:05}-of-{count:05}.gguf")))
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` read-only and parses it.
    ///
    /// Errors: [`GgufError::Io`] if the file cannot be opened or mapped, otherwise any
    /// parse error of [`GgufFile::from_bytes`].
    ///
    /// The first file of a split model (`split.count` > 1, named `…-00001-of-0000N.gguf`
    /// as llama.cpp's `gguf-split` writes it) opens the other shards beside it and lists
    /// all their tensors; [`GgufError::Split`] if one is missing or disagrees (its
    /// `split.no`, `split.count`, a tensor named twice, `split.tensors.count`).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        Self::open_one(path.as_ref())?.join_split(path.as_ref(), Self::open_one)
    }

    /// Opens the shards of a split model after this, its first file, read from `path`.
    fn join_split(
        mut self,
        path: &Path,
        load: impl Fn(&Path) -> Result<GgufFile>,
    ) -> Result<GgufFile> {
        let count = self
            .get("split.count")
            .and_then(MetaValue::as_u64)
            .unwrap_or(1) as usize;
        if count <= 1 {
            return Ok(self);
        }
        let err = |detail: String| GgufError::Split {
            path: path.to_path_buf(),
            detail,
        };
        let no = |f: &GgufFile| f.get("split.no").and_then(MetaValue::as_u64);
        if no(&self) != Some(0) {
            let which = no(&self).map_or("a shard without split.no".to_string(), |n| {
                format!("shard {} of {count}", n.saturating_add(1))
            });
            return Err(err(format!(
                "this is {which}; open the first, named …-00001-of-{count:05}.gguf"
            )));
        }
        if count > MAX_SHARDS {
            return Err(err(format!(
                "split.count {count} is not a plausible shard count"
            )));
        }
        self.tensor_shard = vec![0; self.tensors.len()];
        for k in 2..=count {
            let p = split_path(path, k, count).ok_or_else(|| {
                err(format!(
                    "the first shard's name must end in -00001-of-{count:05}.gguf"
                ))
            })?;
            let shard = load(&p).map_err(|e| err(format!("shard {k}: {e}")))?;
            if no(&shard) != Some(k as u64 - 1)
                || shard.get("split.count").and_then(MetaValue::as_u64) != Some(count as u64)
            {
                return Err(err(format!(
                    "{} does not say it is shard {k} of {count}",
                    p.display()
                )));
            }
            for t in &shard.tensors {
                if self.tensor_index.contains_key(&t.name) {
                    return Err(err(format!("tensor {:?} is in two shards", t.name)));
                }
                self.tensor_index.insert(t.name.clone(), self.tensors.len());
                self.tensors.push(t.clone());
                self.tensor_shard.push(k - 1);
            }
            self.shards.push(shard);
        }
        if let Some(n) = self.get("split.tensors.count").and_then(MetaValue::as_u64) {
            if n != self.tensors.len() as u64 {
                return Err(err(format!(
                    "split.tensors.count is {n}, the shards hold {}",
                    self.tensors.len()
                )));
            }
        }
        Ok(self)
    }

    /// Maps one file (no shards).
    fn open_one(path: &Path) -> Result<GgufFile> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // mmap of an empty file fails on some platforms; the parser reports the truncation.
            return Self::parse(Backing::Owned(Vec::new()));
        }
        // SAFETY: the mapping is read-only and private to this process. Its contents may
        // change or vanish only if another process rewrites or truncates the file while it
        // is mapped (then reads may observe new bytes or fault with SIGBUS); the store moves
        // finished files into place atomically and never rewrites them, and every offset we
        // derive is bounds-checked against the length the mapping had when parsed.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Mmap(mmap))
    }

    /// Reads the whole file into memory and parses it: the safe twin of [`GgufFile::open`],
    /// used by tests to check that both give the same result.
    pub fn read(path: impl AsRef<Path>) -> Result<GgufFile> {
        let read_one = |path: &Path| {
            let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            Self::from_bytes(bytes)
        };
        read_one(path.as_ref())?.join_split(path.as_ref(), read_one)
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<GgufFile> {
        let header = parse_header(backing.bytes())?;
        Ok(GgufFile {
            backing,
            version: header.version,
            key_index: header
                .metadata
                .iter()
                .enumerate()
                .map(|(i, (k, _))| (k.clone(), i))
                .collect(),
            metadata: header.metadata,
            tensor_index: header
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: header.tensors,
            alignment: header.alignment,
            data_offset: header.data_offset,
            shards: Vec::new(),
            tensor_shard: Vec::new(),
            looked_up: Default::default(),
        })
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Asks the OS to drop the resident pages of the mapped bytes `range` (file offsets,
    /// widened to whole pages); they are read from the file again if touched later. A
    /// no-op for a file read into memory. Used for weights copied elsewhere (the MoE
    /// expert cache) so the mapping does not keep them resident as well.
    ///
    /// Errors: the range is outside the file, or `madvise` failed.
    pub fn release(&self, range: std::ops::Range<usize>) -> std::io::Result<()> {
        let Backing::Mmap(m) = &self.backing else {
            return Ok(());
        };
        if range.start > range.end || range.end > m.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "release: range outside the file",
            ));
        }
        const PAGE: usize = 4096;
        let start = range.start / PAGE * PAGE;
        let end = range.end.div_ceil(PAGE).saturating_mul(PAGE).min(m.len());
        if start >= end {
            return Ok(());
        }
        #[cfg(unix)]
        // SAFETY: the mapping is read-only and file-backed (`Mmap::map`: PROT_READ,
        // MAP_SHARED) and nothing ever writes to it, so MADV_DONTNEED only drops clean
        // pages: the next access faults the same bytes back in from the file, and every
        // borrow of the mapping keeps seeing identical contents. The range is in bounds
        // (checked above; widened to pages only within the mapping).
        #[allow(unsafe_code)]
        unsafe {
            m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)?;
        }
        Ok(())
    }

    /// File size in bytes (of all shards of a split model).
    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64 + self.shards.iter().map(|s| s.file_len()).sum::<u64>()
    }

    /// All metadata pairs in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    /// The value of metadata key `key` (the lookup is remembered:
    /// [`GgufFile::keys_looked_up`]).
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        if let Ok(mut seen) = self.looked_up.lock() {
            if !seen.contains(key) {
                seen.insert(key.to_string());
            }
        }
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every key [`GgufFile::get`] has been asked for so far, present in the file or not:
    /// after loading a model, the metadata it reads (the keys of [`GgufFile::metadata`]
    /// not in this set change nothing).
    pub fn keys_looked_up(&self) -> std::collections::BTreeSet<String> {
        self.looked_up.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Removes metadata key `key` and returns its value (`None` if absent); later [`get`]s of
    /// it find nothing.
    ///
    /// For callers that keep the file for its tensors after consuming its largest values:
    /// the vocabulary arrays of a 262k-token model are about 20 MB of parsed strings.
    ///
    /// [`get`]: GgufFile::get
    pub fn remove_metadata(&mut self, key: &str) -> Option<MetaValue> {
        let i = self.key_index.remove(key)?;
        let (_, value) = self.metadata.remove(i);
        for j in self.key_index.values_mut() {
            if *j > i {
                *j -= 1;
            }
        }
        Some(value)
    }

    /// Sets metadata `key` to `value` in memory (replacing its value, or appending the
    /// pair): what later reads of [`GgufFile::get`] see; the file is not touched. For an
    /// override of one key, as llama.cpp's `--override-kv` does, and for tests that vary
    /// one key of a large file without copying its tensors.
    pub fn set_metadata(&mut self, key: &str, value: MetaValue) {
        match self.key_index.get(key) {
            Some(&i) => self.metadata[i].1 = value,
            None => {
                self.key_index.insert(key.to_string(), self.metadata.len());
                self.metadata.push((key.to_string(), value));
            }
        }
    }

    /// `general.architecture`, if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture")?.as_str()
    }

    /// All tensor infos in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name` with its data.
    pub fn tensor(&self, name: &str) -> Option<Tensor<'_>> {
        self.tensor_index.get(name).map(|&i| self.tensor_at(i))
    }

    /// Index of the tensor called `name` in [`GgufFile::tensor_infos`].
    pub fn tensor_index(&self, name: &str) -> Option<usize> {
        self.tensor_index.get(name).copied()
    }

    /// Every tensor with its data, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> + '_ {
        (0..self.tensors.len()).map(|i| self.tensor_at(i))
    }

    /// Every file of this model, opened from `first`: `first`, then the other shards of a
    /// split model as [`split_path`] names them (a command that writes files must not
    /// overwrite any of them).
    pub fn shard_paths(&self, first: &Path) -> Vec<std::path::PathBuf> {
        let count = self
            .get("split.count")
            .and_then(MetaValue::as_u64)
            .unwrap_or(1) as usize;
        let mut out = vec![first.to_path_buf()];
        out.extend((2..=count.min(MAX_SHARDS)).filter_map(|k| split_path(first, k, count)));
        out
    }

    /// The shard (0 = this file) holding the tensor at index `i` of
    /// [`GgufFile::tensor_infos`]: 0 for every tensor of a file that is not split.
    pub fn tensor_shard(&self, i: usize) -> usize {
        self.tensor_shard.get(i).copied().unwrap_or(0)
    }

    /// The tensor at index `i` of [`GgufFile::tensor_infos`] with its data.
    ///
    /// Panics if `i` is out of range (indices come from `tensor_infos`).
    pub fn tensor_at(&self, i: usize) -> Tensor<'_> {
        let info = &self.tensors[i];
        let file = match self.tensor_shard.get(i) {
            Some(&k) if k > 0 => &self.shards[k - 1],
            _ => self,
        };
        // Bounds were checked in parse_tensor_infos (of the file holding the tensor):
        // data_offset + offset + n_bytes <= len.
        let start = (file.data_offset + info.offset) as usize;
        Tensor {
            info,
            data: &file.backing.bytes()[start..start + info.n_bytes as usize],
        }
    }
}

/// Everything the header parse yields.
struct Header {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian reader over the file image.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 byte length, then that many bytes of UTF-8.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let start = self.pos as u64;
        let len = self.u64(&|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| GgufError::InvalidMetadata {
            offset: start,
            detail: format!("{} is not valid UTF-8 ({e})", what()),
        })
    }

    /// Checks that `count` elements of at least `min_size` bytes each can still fit, so a
    /// hostile count never drives an allocation.
    fn check_count(&self, count: u64, min_size: usize, what: &dyn Fn() -> String) -> Result<usize> {
        match count.checked_mul(min_size as u64) {
            Some(n) if n <= self.remaining() as u64 => Ok(count as usize),
            _ => Err(GgufError::Truncated {
                what: format!("{} ({count} elements of at least {min_size} bytes)", what()),
                offset: self.pos as u64,
                needed: count.saturating_mul(min_size as u64),
                file_len: self.buf.len() as u64,
            }),
        }
    }
}

fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.array(&|| "magic".into())?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32(&|| "version".into())?;
    if version != 2 && version != 3 {
        // gguf-py writes the magic little-endian even in big-endian files, so those show
        // up here as a version with its low half zero (3 becomes 0x03000000).
        let big_endian = version != 0 && version & 0xffff == 0;
        return Err(GgufError::UnsupportedVersion {
            version,
            big_endian,
        });
    }
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.u64(&|| "metadata count".into())?;

    // Smallest key/value pair: 8-byte key length, 4-byte type, 1-byte value.
    let n_kv = c.check_count(n_kv, 13, &|| "metadata pairs".into())?;
    let mut metadata: Vec<(String, MetaValue)> = Vec::with_capacity(n_kv);
    let mut seen: HashMap<String, u64> = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key_offset = c.pos as u64;
        let key = c.string(&|| format!("key of metadata pair {i}"))?;
        let type_offset = c.pos as u64;
        let type_id = c.u32(&|| format!("value type of {key:?}"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            type_id,
            offset: type_offset,
        })?;
        let value = read_value(&mut c, ty, &key, 0)?;
        if let Some(first) = seen.insert(key.clone(), key_offset) {
            return Err(GgufError::InvalidMetadata {
                offset: key_offset,
                detail: format!("duplicate key {key:?} (first at byte {first})"),
            });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, MetaValue::U32(a))) if *a != 0 && a.is_power_of_two() => *a as u64,
        Some((_, v)) => {
            return Err(GgufError::InvalidMetadata {
                offset: seen["general.alignment"],
                detail: format!(
                    "general.alignment must be a non-zero power of two of type u32, found {} {v}",
                    v.value_type().name()
                ),
            })
        }
    };

    // Smallest tensor info: 8-byte name length, 4-byte n_dims, one 8-byte dim, 4-byte type,
    // 8-byte offset.
    let n_tensors = c.check_count(n_tensors, 32, &|| "tensor infos".into())?;
    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        tensors.push(read_tensor_info(&mut c, i, alignment)?);
    }
    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    check_tensor_data(&tensors, data_offset, buf.len() as u64)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Reads one value of type `ty` (arrays recursively, at most [`MAX_ARRAY_DEPTH`] deep).
fn read_value(c: &mut Cursor<'_>, ty: ValueType, key: &str, depth: usize) -> Result<MetaValue> {
    let what = || format!("value of {key:?}");
    Ok(match ty {
        ValueType::U8 => MetaValue::U8(c.array::<1>(&what)?[0]),
        ValueType::I8 => MetaValue::I8(c.array::<1>(&what)?[0] as i8),
        ValueType::U16 => MetaValue::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => MetaValue::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => MetaValue::U32(u32::from_le_bytes(c.array(&what)?)),
        ValueType::I32 => MetaValue::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => MetaValue::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::U64 => MetaValue::U64(u64::from_le_bytes(c.array(&what)?)),
        ValueType::I64 => MetaValue::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => MetaValue::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => {
            let offset = c.pos as u64;
            match c.array::<1>(&what)?[0] {
                0 => MetaValue::Bool(false),
                1 => MetaValue::Bool(true),
                b => {
                    return Err(GgufError::InvalidMetadata {
                        offset,
                        detail: format!("bool value of {key:?} is {b}, not 0 or 1"),
                    })
                }
            }
        }
        ValueType::String => MetaValue::String(c.string(&what)?),
        ValueType::Array => MetaValue::Array(read_array(c, key, depth + 1)?),
    })
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<MetaArray> {
    let start = c.pos as u64;
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::InvalidMetadata {
            offset: start,
            detail: format!("arrays of {key:?} nest deeper than {MAX_ARRAY_DEPTH} levels"),
        });
    }
    let type_id = c.u32(&|| format!("array element type of {key:?}"))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset: start,
    })?;
    let count = c.u64(&|| format!("array length of {key:?}"))?;
    let n = c.check_count(count, ty.min_size(), &|| format!("array {key:?}"))?;

    /// Reads `n` fixed-size little-endian elements in one bounds check.
    macro_rules! fixed {
        ($variant:ident, $t:ty) => {{
            const SZ: usize = std::mem::size_of::<$t>();
            let bytes = c.take((n * SZ) as u64, &|| format!("elements of array {key:?}"))?;
            MetaArray::$variant(
                bytes
                    .chunks_exact(SZ)
                    .map(|b| <$t>::from_le_bytes(b.try_into().expect("chunk of SZ bytes")))
                    .collect(),
            )
        }};
    }
    Ok(match ty {
        ValueType::U8 => fixed!(U8, u8),
        ValueType::I8 => fixed!(I8, i8),
        ValueType::U16 => fixed!(U16, u16),
        ValueType::I16 => fixed!(I16, i16),
        ValueType::U32 => fixed!(U32, u32),
        ValueType::I32 => fixed!(I32, i32),
        ValueType::F32 => fixed!(F32, f32),
        ValueType::U64 => fixed!(U64, u64),
        ValueType::I64 => fixed!(I64, i64),
        ValueType::F64 => fixed!(F64, f64),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                match read_value(c, ValueType::Bool, key, depth)? {
                    MetaValue::Bool(b) => v.push(b),
                    _ => unreachable!("read_value(Bool) yields Bool"),
                }
            }
            MetaArray::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array {key:?}"))?);
            }
            MetaArray::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            MetaArray::Array(v)
        }
    })
}

fn read_tensor_info(c: &mut Cursor<'_>, i: usize, alignment: u64) -> Result<TensorInfo> {
    let info_offset = c.pos as u64;
    let name = c.string(&|| format!("name of tensor {i}"))?;
    let invalid = |detail: String| GgufError::InvalidTensor {
        tensor: name.clone(),
        offset: info_offset,
        detail,
    };
    let n_dims = c.u32(&|| format!("n_dims of tensor {name:?}"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(invalid(format!(
            "{n_dims} dimensions (must be 1..={MAX_DIMS})"
        )));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        shape.push(c.u64(&|| format!("dimension {d} of tensor {name:?}"))?);
    }
    let type_offset = c.pos as u64;
    let type_id = c.u32(&|| format!("type of tensor {name:?}"))?;
    let offset = c.u64(&|| format!("data offset of tensor {name:?}"))?;

    if let Some(d) = shape.iter().position(|&n| n == 0) {
        return Err(invalid(format!("dimension {d} is zero in shape {shape:?}")));
    }
    // ggml stores element counts as int64_t: the product must fit.
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(|| invalid(format!("shape {shape:?} overflows the element count")))?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
        tensor: name.clone(),
        type_id,
        offset: type_offset,
    })?;
    let row_bytes = ggml_type.row_bytes(shape[0]).ok_or_else(|| {
        invalid(format!(
            "row length {} is not a multiple of the {ggml_type} block size {}",
            shape[0],
            ggml_type.block_size()
        ))
    })?;
    let n_bytes = row_bytes
        .checked_mul(n_elements / shape[0])
        .ok_or_else(|| invalid(format!("byte size of shape {shape:?} overflows")))?;
    if !offset.is_multiple_of(alignment) {
        return Err(invalid(format!(
            "data offset {offset} is not a multiple of the alignment {alignment}"
        )));
    }
    Ok(TensorInfo {
        name,
        ggml_type,
        shape,
        offset,
        n_bytes,
        info_offset,
    })
}

/// Checks that every tensor's data lies inside the file, that names are unique and that
/// no two tensors share bytes.
fn check_tensor_data(tensors: &[TensorInfo], data_offset: u64, file_len: u64) -> Result<()> {
    let invalid = |t: &TensorInfo, detail: String| GgufError::InvalidTensor {
        tensor: t.name.clone(),
        offset: t.info_offset,
        detail,
    };
    let mut names: HashMap<&str, u64> = HashMap::with_capacity(tensors.len());
    for t in tensors {
        if let Some(first) = names.insert(&t.name, t.info_offset) {
            return Err(invalid(
                t,
                format!("duplicate tensor name (first at byte {first})"),
            ));
        }
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.n_bytes));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(invalid(
                    t,
                    format!(
                        "data [{} + {}, {} bytes) runs past the end of the file at byte {file_len}",
                        data_offset, t.offset, t.n_bytes
                    ),
                ))
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if a.offset + a.n_bytes > b.offset {
            return Err(invalid(
                b,
                format!(
                    "data at offset {} overlaps tensor {:?} (offset {}, {} bytes)",
                    b.offset, a.name, a.offset, a.n_bytes
                ),
            ));
        }
    }
    Ok(())
}
