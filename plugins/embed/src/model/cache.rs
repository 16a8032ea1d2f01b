//! The packed weights cache: every weight of the encoder in the layout the
//! kernels read (dense layers in 64-column panels), written once
//! from model.safetensors and then mapped read-only and shared
//! (`MAP_SHARED`) by every worker, so the page cache holds the one copy
//! that all of them compute on.
//!
//! The file (all little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `M0EMBED\0` |
//! | 8..12 | layout version (u32, [`VERSION`]) |
//! | 12..16 | length of the JSON table (u32) |
//! | 16..24 | data_start: where the tensors begin (u64, a multiple of 4096) |
//! | 24..32 | the file's length (u64) |
//! | 32..40 | model.safetensors' size in bytes (u64) |
//! | 40..48 | model.safetensors' mtime, nanoseconds since 1970 (u64) |
//! | 48..56 | checksum of data_start..end (u64, see [`checksum`]) |
//! | 56.. | the JSON table, then zeros up to data_start |
//!
//! The table is `{"format": "m0embed", "version": 1, "panel": 64,
//! "tensors": [{"name", "shape", "offset", "layout", "columns"}, ...]}`:
//! `offset` is in bytes from data_start (a multiple of 64), every tensor
//! f32. `layout` `"rows"` is row-major in `shape`; `"panels"` is a dense
//! layer's `[out, in]` weight packed as `shape` = `[panels, in, 64]`: panel
//! p holds output columns 64p..64p+64 (`columns` of them real, the rest
//! zero), row i of a panel the 64 weights of input i. Which tensors, in
//! which order, under which names, is the architecture's declaration
//! (tensors.rs, arch/): this file packs the list it is given and names no
//! tensor. Names are the safetensors names without their prefix (`bert.`,
//! `roberta.`...), except query, key and value stacked into one product
//! (BERT's `attention.self.qkv`; columns: query's, key's, value's), BERT's
//! `embeddings.token_type_embeddings.0` (type 0's row alone; `.1` too for a
//! cross-encoder), and the zeros an architecture declares for biases its
//! layers lack. A head's tensors (heads/) keep their names at the file's
//! root (`classifier.weight`). An embedder's table is what it was before
//! heads existed, so its cache is too (no version bump).
//!
//! A model that computes in bf16 has a cache of its own, `model.bf16.m0embed`
//! (`NAME.bf16.m0embed` in a cache folder), beside the f32 one, so both
//! coexist: the same file but for its dense layers' weights, which are bf16
//! in the pair layout the bf16 kernels read (`layers/linear/bf16.rs`):
//! `"layout": "pairs"`, `shape` = `[panels, ceil(in / 2), 64, 2]`, element
//! `[p][kk][j][t]` = the weight of input 2kk + t for output 64p + j (half
//! the bytes). Its table says `"dtype": "bfloat16"` (an f32 table has no
//! `dtype`: it is the table it always was), and since a cache is used only
//! when its table is the one expected, a file of one dtype is never read as
//! the other, whatever its name.
//!
//! A cache is used only when all of it checks: magic, version, length,
//! the source's size and mtime, the table (against the architecture's
//! declaration from config.json)
//! and the checksum; anything else is rebuilt, never trusted. Writers
//! serialise on a lock file beside it (`.NAME.lock`, left in place) and
//! publish by rename of a complete file, so a
//! mapped cache is never changed under a reader, and racing workers map
//! the same file.

use super::error::ModelError;
use super::layers::linear::bf16::{pack_pairs, pairs_len};
use super::layers::linear::{Linear, PANEL, Precision, Weights, pack_panels};
use super::mmap::{Mapping, Tensor};
use super::tensors::{Naming, Origin, TensorList};
use super::weights::SafeTensors;
use crate::settings::ENV_CACHE_DIR;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

// The cache holds little-endian f32s (and bf16s) that the kernels read in
// place.
#[cfg(target_endian = "big")]
compile_error!("the packed weights cache is little-endian, read in place");

/// The cache's name beside model.safetensors.
pub const FILE_NAME: &str = "model.m0embed";
/// The bf16 cache's name beside model.safetensors.
pub const FILE_NAME_BF16: &str = "model.bf16.m0embed";

const MAGIC: &[u8; 8] = b"M0EMBED\0";
/// Bumped whenever the layout of the file or of a tensor changes.
pub const VERSION: u32 = 1;
const FIXED: usize = 56;
const ALIGN: usize = 64;
const PAGE: usize = 4096;

/// model.safetensors as the cache remembers it: a different size or
/// mtime is a different source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Source {
    size: u64,
    mtime_ns: u64,
}

struct Spec {
    name: String,
    shape: Vec<usize>,
    /// Output columns of a panel layout; None for rows.
    columns: Option<usize>,
    /// Bytes from data_start.
    offset: usize,
    /// Elements: f32s, or bf16s for a bf16 cache's dense weights.
    len: usize,
    /// A dense weight stored as bf16 pairs.
    pairs: bool,
    origin: Origin,
    /// Read at the file's root, not under its prefix.
    root: bool,
}

/// The architecture's tensors, where each goes, and the table.
struct Plan {
    specs: Vec<Spec>,
    naming: Naming,
    json: String,
    data_start: usize,
    file_len: usize,
}

impl Spec {
    fn bytes(&self) -> usize {
        self.len * if self.pairs { 2 } else { 4 }
    }
}

impl Plan {
    /// The file for `list`, its dense weights as bf16 pairs when `bf16`.
    fn new(list: TensorList, bf16: bool) -> Plan {
        let mut offset = 0;
        let specs: Vec<Spec> = list
            .tensors
            .into_iter()
            .map(|d| {
                let pairs = bf16 && matches!(d.origin, Origin::Panels { .. });
                let (shape, len) = match &d.origin {
                    Origin::Panels { k, .. } if pairs => {
                        let n = d.columns.expect("a dense weight's columns");
                        let shape = vec![n.div_ceil(PANEL), k.div_ceil(2), PANEL, 2];
                        (shape, pairs_len(*k, n))
                    }
                    _ => (d.shape, d.len),
                };
                let s = Spec {
                    name: d.name,
                    shape,
                    columns: d.columns,
                    offset,
                    len,
                    pairs,
                    origin: d.origin,
                    root: d.root,
                };
                offset += s.bytes().next_multiple_of(ALIGN);
                s
            })
            .collect();
        let table: Vec<serde_json::Value> = specs
            .iter()
            .map(|s| {
                let mut t = serde_json::json!({
                    "name": s.name,
                    "shape": s.shape,
                    "offset": s.offset,
                    "layout": match (s.pairs, s.columns) {
                        (true, _) => "pairs",
                        (false, Some(_)) => "panels",
                        (false, None) => "rows",
                    },
                });
                if let Some(c) = s.columns {
                    t["columns"] = c.into();
                }
                t
            })
            .collect();
        let mut json = serde_json::json!({
            "format": "m0embed",
            "version": VERSION,
            "panel": PANEL,
            "tensors": table,
        });
        if bf16 {
            json["dtype"] = "bfloat16".into();
        }
        let json = json.to_string();
        let data_start = (FIXED + json.len()).next_multiple_of(PAGE);
        Plan {
            specs,
            naming: list.naming,
            json,
            data_start,
            file_len: data_start + offset,
        }
    }

    fn header(&self, source: Source, checksum: u64) -> Vec<u8> {
        let mut h = Vec::with_capacity(self.data_start);
        h.extend_from_slice(MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&(self.json.len() as u32).to_le_bytes());
        h.extend_from_slice(&(self.data_start as u64).to_le_bytes());
        h.extend_from_slice(&(self.file_len as u64).to_le_bytes());
        h.extend_from_slice(&source.size.to_le_bytes());
        h.extend_from_slice(&source.mtime_ns.to_le_bytes());
        h.extend_from_slice(&checksum.to_le_bytes());
        h.extend_from_slice(self.json.as_bytes());
        h.resize(self.data_start, 0);
        h
    }
}

/// FNV-1a over little-endian u64 words in four interleaved lanes (fast
/// enough to check 90 MB at every worker start), folded at the end. `data`
/// is a multiple of 32 bytes (every tensor is padded to 64).
pub fn checksum(data: &[u8]) -> u64 {
    let mut lanes = LANES;
    feed(&mut lanes, data);
    fold(&lanes)
}

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;
const LANES: [u64; 4] = [
    OFFSET_BASIS,
    OFFSET_BASIS ^ 1,
    OFFSET_BASIS ^ 2,
    OFFSET_BASIS ^ 3,
];

fn fold(lanes: &[u64; 4]) -> u64 {
    lanes
        .iter()
        .fold(OFFSET_BASIS, |h, &l| (h ^ l).wrapping_mul(PRIME))
}

fn feed(lanes: &mut [u64; 4], data: &[u8]) {
    for chunk in data.chunks_exact(32) {
        for (lane, w) in lanes.iter_mut().zip(chunk.chunks_exact(8)) {
            let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
            *lane = (*lane ^ w).wrapping_mul(PRIME);
        }
    }
}

/// The mapped cache: where it is and how it came to be.
pub(crate) struct Packed {
    map: Arc<Mapping>,
    plan: Plan,
    /// How its dense layers compute (bf16 pairs in a bf16 cache).
    precision: Precision,
    pub path: PathBuf,
    /// Why it was written by this process (`missing`, `stale: ...`,
    /// `damaged: ...`); None when it was found valid.
    pub built: Option<String>,
}

impl Packed {
    fn spec(&self, name: &str) -> &Spec {
        self.plan
            .specs
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("{name} is not in the cache's plan"))
    }

    /// The f32 tensor `name` of the table, in the mapping.
    pub(crate) fn tensor(&self, name: &str) -> Tensor {
        let s = self.spec(name);
        assert!(
            !s.pairs,
            "{name} is bf16 pairs: a dense layer's (Packed::linear)"
        );
        Tensor::mapped(&self.map, self.plan.data_start + s.offset, s.len)
    }

    /// The dense layer `name` (`{name}.weight` and `{name}.bias`), `k`
    /// inputs and `n` outputs, in the mapping, computing as the cache was
    /// opened for. Panics when k and n are not the table's.
    pub(crate) fn linear(&self, name: &str, k: usize, n: usize) -> Linear {
        let s = self.spec(&format!("{name}.weight"));
        let at = self.plan.data_start + s.offset;
        let w = match self.precision {
            Precision::F32 => Weights::F32(Tensor::mapped(&self.map, at, s.len)),
            Precision::Bf16(kernel) => Weights::Bf16 {
                w: Tensor::mapped(&self.map, at, s.len),
                kernel,
            },
        };
        Linear::new(w, self.tensor(&format!("{name}.bias")), k, n)
    }

    /// Bytes of tensors mapped.
    pub(crate) fn bytes(&self) -> usize {
        self.plan.file_len - self.plan.data_start
    }
}

fn source_of(file: &Path) -> std::io::Result<Source> {
    let m = std::fs::metadata(file)?;
    let mtime_ns = m
        .modified()?
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    Ok(Source {
        size: m.len(),
        mtime_ns,
    })
}

/// Maps `path` if it is a valid cache of `plan` and `source`; else why not.
fn try_map(path: &Path, plan: &Plan, source: Source) -> Result<Arc<Mapping>, String> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err("missing".into()),
        Err(e) => return Err(format!("unreadable: {e}")),
    };
    let map = Mapping::file(&file).map_err(|e| format!("damaged: cannot be mapped: {e}"))?;
    let b = map.bytes();
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    if b.len() < FIXED || &b[..8] != MAGIC {
        return Err("damaged: not a packed weights cache".into());
    }
    if u32_at(8) != VERSION {
        return Err(format!(
            "stale: layout version {} (now {VERSION})",
            u32_at(8)
        ));
    }
    if u64_at(24) != b.len() as u64 {
        return Err(format!(
            "damaged: {} bytes, its header says {}",
            b.len(),
            u64_at(24)
        ));
    }
    let found = Source {
        size: u64_at(32),
        mtime_ns: u64_at(40),
    };
    if found != source {
        return Err("stale: model.safetensors changed since it was written".into());
    }
    let json_len = u32_at(12) as usize;
    if u64_at(16) != plan.data_start as u64
        || b.len() != plan.file_len
        || b.get(FIXED..FIXED + json_len) != Some(plan.json.as_bytes())
    {
        return Err("stale: its tensors are not the ones config.json implies".into());
    }
    if checksum(&b[plan.data_start..]) != u64_at(48) {
        return Err("damaged: checksum mismatch".into());
    }
    Ok(Arc::new(map))
}

/// Why a build failed: the model's own fault, or the place's.
enum BuildError {
    Model(ModelError),
    Io(String),
}

fn io(what: &str, path: &Path) -> impl Fn(std::io::Error) -> BuildError {
    let prefix = format!("{what} {}", path.display());
    move |e| BuildError::Io(format!("{prefix}: {e}"))
}

/// Writes the cache at `path` (unless another process did meanwhile) and
/// maps it; whether this call wrote it.
fn build_at(
    model: &Path,
    path: &Path,
    plan: &Plan,
    source: Source,
) -> Result<(Arc<Mapping>, bool), BuildError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
    let name = path
        .file_name()
        .map_or("cache".into(), |n| n.to_string_lossy());
    let lock_path = dir.join(format!(".{name}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io("cannot create", &lock_path))?;
    // SAFETY: flock on a descriptor this function owns; it blocks until
    // the lock is ours, released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io("cannot lock", &lock_path)(
            std::io::Error::last_os_error(),
        ));
    }
    // Another worker may have written it while this one waited.
    if let Ok(map) = try_map(path, plan, source) {
        return Ok((map, false));
    }
    let st = SafeTensors::open(model, &plan.naming).map_err(BuildError::Model)?;
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = write(&st, plan, source, &tmp);
    drop(st);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("cannot rename into", path)(e)
    })?;
    drop(lock);
    let map = try_map(path, plan, source)
        .map_err(|why| BuildError::Io(format!("{} as written is {why}", path.display())))?;
    Ok((map, true))
}

fn write(st: &SafeTensors, plan: &Plan, source: Source, tmp: &Path) -> Result<(), BuildError> {
    let mut file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(tmp)
        .map_err(io("cannot create", tmp))?;
    let mut lanes = LANES;
    for s in &plan.specs {
        let get =
            |name: &str, shape: &[usize]| st.get_at(name, shape, s.root).map_err(BuildError::Model);
        let f32s = |data: Vec<f32>| -> Vec<u8> {
            assert_eq!(data.len(), s.len, "{} as planned", s.name);
            data.iter().flat_map(|f| f.to_le_bytes()).collect()
        };
        let mut bytes = match &s.origin {
            Origin::Rows {
                name,
                shape,
                skip,
                take,
            } => {
                let v = get(name, shape)?;
                f32s(v[*skip..*skip + *take].to_vec())
            }
            Origin::Panels { parts, k } => {
                let ws = parts
                    .iter()
                    .map(|(n, cols)| get(&format!("{n}.weight"), &[*cols, *k]))
                    .collect::<Result<Vec<_>, _>>()?;
                let sized: Vec<(&[f32], usize)> = ws
                    .iter()
                    .zip(parts)
                    .map(|(w, (_, cols))| (&w[..], *cols))
                    .collect();
                if s.pairs {
                    let pairs = pack_pairs(&sized, *k);
                    assert_eq!(pairs.len(), s.len, "{} as planned", s.name);
                    pairs.iter().flat_map(|h| h.to_le_bytes()).collect()
                } else {
                    f32s(pack_panels(&sized, *k))
                }
            }
            Origin::Biases(parts) => {
                let mut v = Vec::with_capacity(s.len);
                for (n, cols) in parts {
                    v.extend(get(&format!("{n}.bias"), &[*cols])?);
                }
                f32s(v)
            }
            Origin::Zeros => f32s(vec![0.0; s.len]),
        };
        bytes.resize(s.bytes().next_multiple_of(ALIGN), 0);
        feed(&mut lanes, &bytes);
        file.write_all_at(&bytes, (plan.data_start + s.offset) as u64)
            .map_err(io("cannot write", tmp))?;
    }
    file.write_all_at(&plan.header(source, fold(&lanes)), 0)
        .map_err(io("cannot write", tmp))?;
    file.flush().map_err(io("cannot write", tmp))?;
    file.sync_all().map_err(io("cannot sync", tmp))?;
    Ok(())
}

/// The per-user cache folder: $XDG_CACHE_HOME/m0serve/embed, else
/// ~/.cache/m0serve/embed, else a folder of the user's in the temp dir.
fn user_cache() -> PathBuf {
    let abs = |v: &str| {
        std::env::var_os(v)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(x) = abs("XDG_CACHE_HOME") {
        return x.join("m0serve/embed");
    }
    if let Some(h) = abs("HOME") {
        return h.join(".cache/m0serve/embed");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    std::env::temp_dir().join(format!("m0serve-embed-{uid}"))
}

/// The cache's name in a shared cache folder: the model folder's name and
/// a hash of its full path, so that two models never share a name, and
/// `.bf16` before the extension for a bf16 cache.
fn name_in_cache_dir(model: &Path, bf16: bool) -> String {
    let full = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let mut h = OFFSET_BASIS;
    for b in full.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(PRIME);
    }
    let folder: String = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dtype = if bf16 { ".bf16" } else { "" };
    format!("{folder}-{h:016x}{dtype}.m0embed")
}

/// The model folder's weights, packed and mapped: from a valid cache when
/// there is one, else written once (by whichever worker gets the lock
/// first) and then mapped.
///
/// `cache_dir` ([`ENV_CACHE_DIR`]) is where the cache goes; None tries
/// beside model.safetensors, then the per-user cache folder (for model
/// folders this user cannot write). `precision` picks the cache (f32, or
/// bf16 pairs) and how its dense layers compute.
pub(crate) fn open(
    model: &Path,
    tensors: TensorList,
    cache_dir: Option<&Path>,
    precision: Precision,
) -> Result<Packed, ModelError> {
    let file = model.join("model.safetensors");
    let source = match source_of(&file) {
        Ok(s) => s,
        // The same refusal a read gives (missing, unreadable).
        Err(_) => {
            SafeTensors::open(model, &tensors.naming)?;
            return Err(ModelError::new(
                &file,
                "cannot be read",
                "make the file readable by the server's user",
            ));
        }
    };
    let bf16 = matches!(precision, Precision::Bf16(_));
    let plan = Plan::new(tensors, bf16);
    let here = if bf16 { FILE_NAME_BF16 } else { FILE_NAME };
    let places: Vec<PathBuf> = match cache_dir {
        Some(d) => vec![d.join(name_in_cache_dir(model, bf16))],
        None => vec![
            model.join(here),
            user_cache().join(name_in_cache_dir(model, bf16)),
        ],
    };
    let mut why = None;
    for path in &places {
        match try_map(path, &plan, source) {
            Ok(map) => {
                return Ok(Packed {
                    map,
                    plan,
                    precision,
                    path: path.clone(),
                    built: None,
                });
            }
            Err(w) => {
                why.get_or_insert(w);
            }
        }
    }
    let mut failures = Vec::new();
    for path in &places {
        match build_at(model, path, &plan, source) {
            Ok((map, wrote)) => {
                return Ok(Packed {
                    map,
                    plan,
                    precision,
                    path: path.clone(),
                    built: if wrote { why } else { None },
                });
            }
            Err(BuildError::Model(e)) => return Err(e),
            Err(BuildError::Io(e)) => failures.push(e),
        }
    }
    let failures = failures.join("; ");
    Err(match cache_dir {
        Some(d) => ModelError::new(
            d,
            format!("{ENV_CACHE_DIR}: cannot write the packed weights cache there: {failures}"),
            format!(
                "set {ENV_CACHE_DIR} to a folder the server's user can create and write, \
                 or unset it to use the model folder"
            ),
        ),
        None => ModelError::new(
            model,
            format!(
                "cannot write the packed weights cache beside the model or in the user's cache folder: {failures}"
            ),
            format!("set {ENV_CACHE_DIR} to a folder the server's user can write"),
        ),
    })
}
