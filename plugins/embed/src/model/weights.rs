//! `model.safetensors`: an 8-byte little-endian header length, a JSON header
//! (name -> dtype, shape, data_offsets), then the raw little-endian data.
//!
//! Mapped read-only (only while the packed cache is built from it: see
//! cache.rs), checked entry by entry (offsets inside the file, sizes that
//! match shape and dtype), converted to f32 on request.

use super::error::{FIX_REEXPORT, ModelError};
use super::mmap::Mapping;
use super::tensors::Naming;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    F32,
    F16,
    Bf16,
    /// Present in the file but never read as a weight (e.g. I64
    /// position_ids).
    Other(usize),
}

#[derive(Debug)]
struct Entry {
    dtype: Dtype,
    dtype_name: String,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

/// The file's bytes: mapped, or read (tests).
enum Bytes {
    Heap(Vec<u8>),
    Mapped(Mapping),
}

impl Bytes {
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Heap(v) => v,
            Bytes::Mapped(m) => m.bytes(),
        }
    }
}

/// A parsed safetensors file.
pub(crate) struct SafeTensors {
    file: PathBuf,
    data: Bytes,
    base: usize,
    entries: HashMap<String, Entry>,
    /// The prefix the names carry (`"bert."`, say), else `""`.
    prefix: &'static str,
}

fn bad(file: &Path, message: String) -> ModelError {
    ModelError::new(
        file,
        message,
        "the file is damaged or not a safetensors file: restore it from the model's \
         original folder",
    )
}

impl SafeTensors {
    /// The file of `dir`, its names read as `naming` says.
    pub(crate) fn open(dir: &Path, naming: &Naming) -> Result<SafeTensors, ModelError> {
        let file = dir.join("model.safetensors");
        // Mapped, not read: the bytes are converted once into the cache and
        // never held on this process's heap. An empty file cannot be
        // mapped; read, it is refused as too short.
        let data = match std::fs::File::open(&file).and_then(|f| {
            if f.metadata()?.len() == 0 {
                Ok(Bytes::Heap(Vec::new()))
            } else {
                Mapping::file(&f).map(Bytes::Mapped)
            }
        }) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ModelError::new(
                    &file,
                    "file is missing",
                    "put the model's weights in MODEL_DIR as model.safetensors (a \
                     pytorch_model.bin must be converted to safetensors first)",
                ));
            }
            Err(e) => {
                return Err(ModelError::new(
                    &file,
                    format!("cannot be read: {e}"),
                    "make the file readable by the server's user",
                ));
            }
        };
        Self::parse(file, data, naming)
    }

    #[cfg(test)]
    fn parse_vec(file: PathBuf, data: Vec<u8>) -> Result<SafeTensors, ModelError> {
        let bert = Naming {
            arch: "bert",
            anchor: "embeddings.word_embeddings.weight".into(),
            prefixes: &["bert."],
        };
        Self::parse(file, Bytes::Heap(data), &bert)
    }

    fn parse(file: PathBuf, bytes: Bytes, naming: &Naming) -> Result<SafeTensors, ModelError> {
        let data = bytes.get();
        let Some(len) = data.get(..8) else {
            return Err(bad(&file, format!("is {} bytes, too short", data.len())));
        };
        let mut le = [0u8; 8];
        le.copy_from_slice(len);
        let header_len = u64::from_le_bytes(le);
        let base = usize::try_from(header_len)
            .ok()
            .and_then(|h| h.checked_add(8))
            .filter(|&b| b <= data.len())
            .ok_or_else(|| {
                bad(
                    &file,
                    format!("header length {header_len} runs past the end of the file"),
                )
            })?;
        let header: serde_json::Value = serde_json::from_slice(&data[8..base])
            .map_err(|e| bad(&file, format!("header is not JSON: {e}")))?;
        let Some(map) = header.as_object() else {
            return Err(bad(&file, "header is not a JSON object".into()));
        };
        let body = data.len() - base;
        let mut entries = HashMap::new();
        for (name, v) in map {
            if name == "__metadata__" {
                continue;
            }
            let dtype_name = v
                .get("dtype")
                .and_then(|d| d.as_str())
                .unwrap_or("")
                .to_owned();
            let dtype = match dtype_name.as_str() {
                "F32" => Dtype::F32,
                "F16" => Dtype::F16,
                "BF16" => Dtype::Bf16,
                "F64" | "I64" | "U64" => Dtype::Other(8),
                "I32" | "U32" => Dtype::Other(4),
                "I16" | "U16" => Dtype::Other(2),
                "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => Dtype::Other(1),
                other => {
                    return Err(bad(
                        &file,
                        format!("tensor {name} has an unknown dtype \"{other}\""),
                    ));
                }
            };
            let shape: Option<Vec<usize>> =
                v.get("shape").and_then(|s| s.as_array()).and_then(|a| {
                    a.iter()
                        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
                        .collect()
                });
            let offsets: Option<(usize, usize)> = v
                .get("data_offsets")
                .and_then(|o| o.as_array())
                .filter(|o| o.len() == 2)
                .and_then(|o| {
                    let s = usize::try_from(o[0].as_u64()?).ok()?;
                    let e = usize::try_from(o[1].as_u64()?).ok()?;
                    Some((s, e))
                });
            let (Some(shape), Some((start, end))) = (shape, offsets) else {
                return Err(bad(
                    &file,
                    format!("tensor {name} lacks a shape or data_offsets"),
                ));
            };
            let size = match dtype {
                Dtype::F32 => 4,
                Dtype::F16 | Dtype::Bf16 => 2,
                Dtype::Other(s) => s,
            };
            let want = shape
                .iter()
                .try_fold(size, |acc: usize, &d| acc.checked_mul(d));
            if start > end || end > body || want != Some(end - start) {
                return Err(bad(
                    &file,
                    format!(
                        "tensor {name} ({dtype_name} {shape:?}) has data_offsets \
                         [{start}, {end}] that do not fit its size or the file"
                    ),
                ));
            }
            entries.insert(
                name.clone(),
                Entry {
                    dtype,
                    dtype_name,
                    shape,
                    start,
                    end,
                },
            );
        }
        let anchor = &naming.anchor;
        let prefix = if entries.contains_key(anchor.as_str()) {
            ""
        } else if let Some(p) = naming
            .prefixes
            .iter()
            .copied()
            .find(|p| entries.contains_key(&format!("{p}{anchor}")))
        {
            p
        } else {
            let with: Vec<String> = naming
                .prefixes
                .iter()
                .map(|p| format!("{p}{anchor}"))
                .collect();
            return Err(ModelError::new(
                &file,
                format!(
                    "has no {anchor}{}: not the weights of a {} encoder, as config.json's \
                     model_type says",
                    if with.is_empty() {
                        String::new()
                    } else {
                        format!(" (nor {})", with.join(", "))
                    },
                    naming.arch
                ),
                FIX_REEXPORT,
            ));
        };
        Ok(SafeTensors {
            file,
            data: bytes,
            base,
            entries,
            prefix,
        })
    }

    /// The tensor `name` (without the file's prefix) as f32, after
    /// checking that its shape is `shape`.
    #[cfg(test)]
    pub(crate) fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.get_at(name, shape, false)
    }

    /// [`SafeTensors::get`], of a name at the file's root (a task model's
    /// head) when `root`, else under the file's prefix.
    pub(crate) fn get_at(
        &self,
        name: &str,
        shape: &[usize],
        root: bool,
    ) -> Result<Vec<f32>, ModelError> {
        let prefix = if root { "" } else { self.prefix };
        let full = format!("{prefix}{name}");
        let Some(e) = self.entries.get(&full) else {
            return Err(ModelError::new(
                &self.file,
                format!("tensor {full} is missing"),
                FIX_REEXPORT,
            ));
        };
        if e.shape != shape {
            return Err(ModelError::new(
                &self.file,
                format!(
                    "tensor {full} has shape {:?}, config.json implies {shape:?}",
                    e.shape
                ),
                FIX_REEXPORT,
            ));
        }
        let raw = &self.data.get()[self.base + e.start..self.base + e.end];
        match e.dtype {
            Dtype::F32 => Ok(raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()),
            Dtype::F16 => Ok(raw
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect()),
            Dtype::Bf16 => Ok(raw
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect()),
            Dtype::Other(_) => Err(ModelError::new(
                &self.file,
                format!(
                    "tensor {full} is {}, not a float type (F32, F16, BF16)",
                    e.dtype_name
                ),
                FIX_REEXPORT,
            )),
        }
    }
}

/// IEEE half to single, exactly (subnormals, infinities and NaN included).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value = m * 2^-24.
            let v = m as f32 * (1.0 / 16_777_216.0);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 112) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(header: &str, body: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn reads_f32_f16_bf16_with_and_without_prefix() {
        let body: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .chain([0x00, 0x3c]) // f16 1.0
            .chain([0x80, 0x3f]) // bf16 1.0
            .collect();
        for prefix in ["", "bert."] {
            let h = format!(
                r#"{{"__metadata__":{{"format":"pt"}},
                "{prefix}embeddings.word_embeddings.weight":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}},
                "{prefix}a":{{"dtype":"F16","shape":[1],"data_offsets":[8,10]}},
                "{prefix}b":{{"dtype":"BF16","shape":[1,1],"data_offsets":[10,12]}}}}"#
            );
            let st = SafeTensors::parse_vec("x".into(), file_with(&h, &body)).unwrap();
            assert_eq!(
                st.get("embeddings.word_embeddings.weight", &[2]).unwrap(),
                vec![1.5, -2.0]
            );
            assert_eq!(st.get("a", &[1]).unwrap(), vec![1.0]);
            assert_eq!(st.get("b", &[1, 1]).unwrap(), vec![1.0]);
            let e = st.get("a", &[2]).unwrap_err();
            assert!(e.message.contains("has shape [1]"), "{e}");
            assert!(st.get("missing", &[1]).is_err());
        }
    }

    #[test]
    fn refuses_damaged_files() {
        let ok_h = r#"{"embeddings.word_embeddings.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        let cases: Vec<Vec<u8>> = vec![
            vec![1, 2, 3],
            file_with(ok_h, &[0; 4]),
            {
                let mut v = file_with(ok_h, &[0; 8]);
                v[0] = 0xff;
                v[7] = 0x7f;
                v
            },
            file_with("not json", &[]),
            file_with(
                r#"{"embeddings.word_embeddings.weight":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            file_with(
                r#"{"other":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
            file_with(
                r#"{"embeddings.word_embeddings.weight":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}}"#,
                &[0; 8],
            ),
        ];
        for (i, c) in cases.into_iter().enumerate() {
            let e = SafeTensors::parse_vec("w.safetensors".into(), c);
            assert!(e.is_err(), "case {i} was accepted");
            assert_eq!(e.err().unwrap().file, PathBuf::from("w.safetensors"));
        }
    }

    #[test]
    fn f16_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert!(f16_to_f32(0x7c00).is_infinite());
    }
}
