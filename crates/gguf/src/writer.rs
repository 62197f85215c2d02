//! The GGUF writer, for tests and tools: builds a GGUF v2/v3 image in the layout the reader
//! (and llama.cpp) expects, tensors packed in order at `general.alignment`.

use std::path::Path;

use crate::error::{GgufError, Result};
use crate::reader::DEFAULT_ALIGNMENT;
use crate::types::GgmlType;
use crate::value::{MetaArray, MetaValue};

/// A tensor queued for writing.
struct PendingTensor {
    name: String,
    ggml_type: GgmlType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory.
///
/// ```
/// use frink_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", MetaValue::String("llama".into()));
/// w.add_tensor("x", GgmlType::F32, &[2], 1f32.to_le_bytes().iter().chain(&2f32.to_le_bytes()).copied().collect()).unwrap();
/// let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
/// assert_eq!(f.tensor("x").unwrap().data.len(), 8);
/// ```
pub struct GgufWriter {
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty GGUF v3 image.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// A writer holding everything `file` holds (version, metadata in order, tensors in
    /// order): `to_bytes` gives the same image for files laid out as llama.cpp's tools lay
    /// them out, and tests edit the copy to make variants of a real file.
    pub fn from_file(file: &crate::GgufFile) -> Result<GgufWriter> {
        let mut w = GgufWriter::new();
        w.set_version(file.version());
        for (k, v) in file.metadata() {
            w.add_metadata(k.clone(), v.clone());
        }
        for t in file.tensors() {
            w.add_tensor(
                t.info.name.clone(),
                t.info.ggml_type,
                &t.info.shape,
                t.data.to_vec(),
            )?;
        }
        Ok(w)
    }

    /// Sets the version written in the header (2 and 3 share one layout).
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Appends a metadata pair (a second pair with the same key replaces the first).
    /// `general.alignment` (u32) also sets the data alignment.
    pub fn add_metadata(&mut self, key: impl Into<String>, value: MetaValue) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Appends a tensor. `shape` is ne0 first; `data` must be exactly the stored size.
    ///
    /// Errors: [`GgufError::Write`] if the shape is empty, has a zero dimension, is not a
    /// whole number of blocks, or `data` has the wrong length.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        shape: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        let n_elements: u64 = shape.iter().product();
        if shape.is_empty() || n_elements == 0 {
            return Err(GgufError::Write(format!(
                "tensor {name:?}: empty shape {shape:?}"
            )));
        }
        let expected = ggml_type
            .row_bytes(shape[0])
            .map(|r| r * (n_elements / shape[0]))
            .ok_or_else(|| {
                GgufError::Write(format!(
                    "tensor {name:?}: row length {} is not a multiple of {ggml_type}'s block size",
                    shape[0]
                ))
            })?;
        if data.len() as u64 != expected {
            return Err(GgufError::Write(format!(
                "tensor {name:?}: {} bytes of data, {ggml_type} {shape:?} needs {expected}",
                data.len()
            )));
        }
        self.tensors.push(PendingTensor {
            name,
            ggml_type,
            shape: shape.to_vec(),
            data,
        });
        Ok(self)
    }

    fn alignment(&self) -> u64 {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, MetaValue::U32(a))) if *a != 0 => *a as u64,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// The complete file image.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let infos: Vec<(&str, GgmlType, &[u64], u64)> = self
            .tensors
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    t.ggml_type,
                    &t.shape[..],
                    t.data.len() as u64,
                )
            })
            .collect();
        let mut out = self.header(&infos);
        let alignment = self.alignment();
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad(&mut out, alignment);
        }
        Ok(out)
    }

    /// The header of a file with this writer's metadata and the tensors `infos` (name,
    /// type, shape, bytes; in order), padded to the alignment: where the first tensor's
    /// data begins.
    fn header(&self, infos: &[(&str, GgmlType, &[u64], u64)]) -> Vec<u8> {
        let alignment = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(infos.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            write_string(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            write_value(&mut out, value);
        }
        let mut offset = 0u64;
        for (name, ty, shape, bytes) in infos {
            write_string(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in *shape {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + bytes).div_ceil(alignment) * alignment;
        }
        pad(&mut out, alignment);
        out
    }

    /// Writes to `out` a file with this writer's metadata (its own tensors are not
    /// written) and the tensors `infos` (name, type, shape; in order), asking
    /// `data(i, sink)` for tensor `i`'s bytes in turn: a file larger than memory is
    /// made one tensor (or one part of one) at a time.
    ///
    /// Errors: a shape that is not whole blocks of its type, a tensor whose `data` wrote
    /// other than its size, or the writer's or `data`'s I/O error.
    pub fn stream<W: std::io::Write>(
        &self,
        out: &mut W,
        infos: &[(String, GgmlType, Vec<u64>)],
        mut data: impl FnMut(usize, &mut dyn std::io::Write) -> std::io::Result<()>,
    ) -> Result<()> {
        let io = |source| GgufError::Io {
            path: std::path::PathBuf::from("(output)"),
            source,
        };
        let mut sized = Vec::with_capacity(infos.len());
        for (name, ty, shape) in infos {
            let n: u64 = shape.iter().product();
            let bytes = shape
                .first()
                .and_then(|&r| ty.row_bytes(r))
                .filter(|_| n > 0)
                .map(|r| r * (n / shape[0]))
                .ok_or_else(|| GgufError::Write(format!("tensor {name:?}: {ty} {shape:?}")))?;
            sized.push((name.as_str(), *ty, &shape[..], bytes));
        }
        out.write_all(&self.header(&sized)).map_err(io)?;
        let alignment = self.alignment();
        for (i, &(name, _, _, bytes)) in sized.iter().enumerate() {
            let mut counted = Counted {
                inner: &mut *out,
                n: 0,
            };
            data(i, &mut counted).map_err(io)?;
            if counted.n != bytes {
                return Err(GgufError::Write(format!(
                    "tensor {name:?}: {} bytes written, {bytes} expected",
                    counted.n
                )));
            }
            let padded = bytes.div_ceil(alignment) * alignment;
            out.write_all(&vec![0u8; (padded - bytes) as usize])
                .map_err(io)?;
        }
        Ok(())
    }

    /// Writes the image to `path`.
    pub fn write_to_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_bytes()?).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// A writer that counts the bytes passed through it.
struct Counted<'a, W: std::io::Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: std::io::Write> std::io::Write for Counted<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn pad(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::U8(v) => out.push(*v),
        MetaValue::I8(v) => out.push(*v as u8),
        MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::Bool(v) => out.push(*v as u8),
        MetaValue::String(s) => write_string(out, s),
        MetaValue::Array(a) => write_array(out, a),
        MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
    }
}

fn write_array(out: &mut Vec<u8>, a: &MetaArray) {
    out.extend_from_slice(&(a.elem_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    match a {
        MetaArray::Array(inner) => inner.iter().for_each(|x| write_array(out, x)),
        _ => (0..a.len()).for_each(|i| write_value(out, &a.get(i).expect("index below len"))),
    }
}
