//! A native, pure-Rust forward pass (f32, or bf16 dense layers on CPUs with
//! AMX-BF16 or AVX512-BF16: [`LoadOptions::dtype`]) of a sentence-transformers encoder:
//! BERT (all-MiniLM-L6-v2 and its kin), RoBERTa, XLM-RoBERTa, CamemBERT,
//! DistilBERT, MPNet and ModernBERT ([`SUPPORTED_MODEL_TYPES`]).
//!
//! ```no_run
//! use m0_embed::model::{LoadOptions, Model};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Model::load("/models/all-MiniLM-L6-v2".as_ref(), LoadOptions::default())?;
//! let batch = model.tokenize(&["a sentence", "another one"], true)?;
//! let vectors = model.embed(&batch, model.info().normalize); // 2 * dim floats
//! assert_eq!(vectors.len(), 2 * model.info().dim);
//! # Ok(()) }
//! ```
//!
//! # One copy of the weights, for every worker and every runtime
//!
//! [`Model::load`] does not read the weights into memory: it maps a packed
//! cache of them, `model.m0embed` beside model.safetensors (or in
//! [`crate::settings::ENV_CACHE_DIR`]), read-only and `MAP_SHARED`, and the kernels compute
//! on that mapping. Every process that maps the file shares the same
//! page-cache pages, so N workers hold one copy, not N. The cache is
//! written once, when missing, stale (model.safetensors changed, another
//! layout version) or damaged, by whichever process takes its lock first,
//! and published by rename: a mapped cache never changes under a reader.
//!
//! The file, all little-endian: 56 fixed bytes (magic `M0EMBED\0`, u32
//! layout version [`CACHE_VERSION`], u32 length of the JSON table, u64
//! `data_start` (a multiple of 4096), u64 file length, u64
//! model.safetensors' size, u64 its mtime in ns, u64 [`checksum`] of
//! `data_start..`), the JSON table, zeros up to `data_start`, then the
//! tensors, each f32 at `data_start + offset` (64-byte aligned). The
//! table is `{"format": "m0embed", "version": 1, "panel": 64, "tensors":
//! [{"name", "shape", "offset", "layout", "columns"}]}`; names are the
//! safetensors names without their prefix (`bert.`, `roberta.`...), except
//! the stacked query, key and value products (BERT's
//! `attention.self.qkv`, DistilBERT's `attention.qkv_lin`, MPNet's
//! `attention.attn.qkv`), BERT's
//! `embeddings.token_type_embeddings.0` (type 0's row; a BERT
//! cross-encoder's cache adds `.1`, type 1's, for the second text of a
//! pair), and zeros for the biases an architecture lacks. A task model's
//! head follows the encoder's tensors under its own names in the file
//! (`classifier.weight`, `cls.predictions.bias`; BERT's pooler as
//! `pooler.dense`). `"rows"` tensors
//! are row-major in `shape`; `"panels"` are a dense layer's `[out, in]`
//! weight as `[panels, in, 64]`, panel p holding outputs 64p..64p+64
//! (`columns` of them real, the rest zero).
//!
//! In bfloat16 ([`LoadOptions::dtype`]) the cache is `model.bf16.m0embed`,
//! beside the f32 one: the same table but for the dense layers' weights,
//! `"layout": "pairs"`, bf16 in the pair layout of `vdpbf16ps` and AMX
//! (`[panels, ceil(in / 2), 64, 2]`), and `"dtype": "bfloat16"` (see
//! cache.rs).
//!
//! A Python backend (the pyembed plugin's, say) gets the same pages with
//! numpy, no copy:
//!
//! ```python
//! import json, mmap, struct, numpy as np
//! f = open(path, "rb")
//! mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
//! magic, version, table_len, data_start = struct.unpack_from("<8sIIQ", mm, 0)
//! table = json.loads(mm[56:56 + table_len])
//! t = {e["name"]: e for e in table["tensors"]}
//! def tensor(name):
//!     e = t[name]
//!     a = np.frombuffer(mm, "<f4", int(np.prod(e["shape"])), data_start + e["offset"])
//!     return a.reshape(e["shape"])
//! name = "encoder.layer.0.intermediate.dense.weight"
//! w = tensor(name)  # [panels, in, 64], the shared pages themselves
//! # x @ W.T straight from the panels (unpacking to [out, in] would copy):
//! y = np.einsum("mk,pkc->mpc", x, w).reshape(len(x), -1)[:, :t[name]["columns"]]
//! ```
//!
//! (A runtime that wants the original layout can also `numpy.frombuffer`
//! an `mmap` of model.safetensors itself when its tensors are F32: an
//! 8-byte header length, the JSON header, then the raw data.)
//! tests/embed/read_cache.py reads every tensor so and checks it against
//! model.safetensors.
//!
//! A forward pass's large scratch buffers are anonymous mappings of its
//! own, unmapped when it ends, so a worker's memory after a long batch is
//! what it runs next, not the longest batch it has seen.
//!
//! Its files, from the top down: `registry` (config.json's model_type ->
//! the architecture that serves it, its `architectures` and modules.json
//! -> the task and head, or a refusal naming what is served), `task`,
//! `heads/` (what a task model adds after the encoder: a cross-encoder's
//! classifier head, SPLADE's masked-LM head and pooling),
//! `arch/` (one file per architecture behind one trait: its config.json
//! fields, its tensors declared once, its packed forward pass), `layers/`
//! (the blocks architectures compose: the dense layer on 64-column panels
//! with an AVX-512 kernel for small batches and gemm for large ones,
//! LayerNorm, the packed attention, activations), `kernels` (SIMD
//! element- and row-wise work, attention of short sequences, picked per
//! CPU at run time), `strided` (attention's products for long sequences,
//! on gemm), `tensors` (the declaration an architecture makes of its
//! weights), `cache` (the packed weights cache written from that
//! declaration, mapped and shared by every worker), `weights`
//! (safetensors), `mmap` (the mappings: shared read-only files, per-pass
//! scratch), `config` (the sentence-transformers files), `static_folder`
//! (a StaticEmbedding model's folder, served by a native backend), `tokenize`,
//! `pooling`, `error`; `profile` (the share of a pass in each kind of
//! layer, with the `profile` feature).

mod arch;
mod cache;
mod config;
mod error;
mod heads;
#[macro_use]
mod kernels;
mod layers;
mod mmap;
mod pooling;
pub mod profile;
mod registry;
mod static_folder;
mod strided;
mod task;
mod team;
mod tensors;
#[cfg(test)]
mod test_support;
mod tokenize;
mod weights;

pub use cache::{FILE_NAME as CACHE_FILE_NAME, VERSION as CACHE_VERSION, checksum};
pub use config::Pooling;
pub use error::ModelError;
pub use registry::SUPPORTED as SUPPORTED_MODEL_TYPES;
pub use static_folder::static_module;
pub use task::Task;
pub use team::share_cpus;
pub use tokenize::{Encoded, Side, TokenSpan, TokenizeError, Tokenizer, TooLong};

pub use crate::settings::Dtype;

use layers::linear::{Bf16Kernel, Precision};
use std::path::{Path, PathBuf};

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Most compute threads one [`Model::embed`] call uses (split over the
    /// dense layers' output columns and over attention heads); 1 (the
    /// default) runs the call on the caller's thread alone. With more, a
    /// call takes its part of the process's CPUs ([`share_cpus`]) among
    /// the calls computing at each layer's start, up to this many: every
    /// core for a lone call, one each under load.
    pub threads: usize,
    /// The name [`ModelInfo::name`] reports; `None` (the default) takes the
    /// folder's name.
    pub name: Option<String>,
    /// The folder of the packed weights cache
    /// ([`crate::settings::ENV_CACHE_DIR`]); `None`
    /// (the default) puts it beside model.safetensors, or in the user's
    /// cache folder ($XDG_CACHE_HOME or ~/.cache, then m0serve/embed) when
    /// the model's folder cannot be written.
    pub cache_dir: Option<PathBuf>,
    /// The dense layers' compute type ([`crate::settings::ENV_DTYPE`]'s
    /// values): [`Dtype::Float32`] by default here, so that a library
    /// caller gets f32 unless it asks (the plugin passes the variable,
    /// whose default is [`Dtype::Auto`]). bfloat16 rounds the dense layers'
    /// weights and inputs to bf16 and sums in f32: a CPU without AMX-BF16
    /// or AVX512-BF16 refuses it ([`dtype_on_this_cpu`]).
    pub dtype: Dtype,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 1,
            name: None,
            cache_dir: None,
            dtype: Dtype::Float32,
        }
    }
}

/// The compute type `dtype` means on this CPU: `"float32"` or
/// `"bfloat16"` (TEI's names, as [`ModelInfo::dtype`] reports them). A
/// forced bfloat16 on a CPU with neither AMX-BF16 (granted by the OS) nor
/// AVX512-BF16 is refused, naming the missing features, the variable and
/// the fix.
pub fn dtype_on_this_cpu(dtype: Dtype) -> Result<&'static str, String> {
    precision(dtype).map(|p| dtype_name(&p))
}

fn dtype_name(p: &Precision) -> &'static str {
    match p {
        Precision::F32 => "float32",
        Precision::Bf16(_) => "bfloat16",
    }
}

/// How the dense layers compute for `dtype` on this CPU.
fn precision(dtype: Dtype) -> Result<Precision, String> {
    // float32 asks nothing of the CPU, nor Linux for AMX's tile state.
    if dtype == Dtype::Float32 {
        return Ok(Precision::F32);
    }
    match (dtype, Bf16Kernel::detect()) {
        (Dtype::Float32, _) | (Dtype::Auto, None) => Ok(Precision::F32),
        (Dtype::Auto | Dtype::Bfloat16, Some(k)) => Ok(Precision::Bf16(k)),
        (Dtype::Bfloat16, None) => Err(format!(
            "{}=bfloat16, and this CPU has neither avx512_bf16 nor amx_bf16 (the bf16 \
             instructions the encoder's bf16 kernels run on: AVX512-BF16 on AMD Zen 4 and \
             later or Intel Cooper Lake and Sapphire Rapids, AMX-BF16 on Sapphire Rapids and \
             later, with a Linux that grants AMX's tile state); unset {} (auto computes in \
             float32 on this CPU) or set it to float32",
            crate::settings::ENV_DTYPE,
            crate::settings::ENV_DTYPE
        )),
    }
}

/// What `--doctor` reports as `embed.kernels`: the dense layers' products.
fn kernels_name(p: &Precision, isa: kernels::Isa) -> &'static str {
    match (p, isa) {
        (Precision::Bf16(k), _) => k.name(),
        (Precision::F32, kernels::Isa::Avx512) => "avx512f f32 panels, gemm",
        (Precision::F32, kernels::Isa::Avx2) => "avx2+fma f32 panels, gemm",
        (Precision::F32, kernels::Isa::Scalar) => "gemm f32",
    }
}

/// What a loaded model is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// [`LoadOptions::name`], else the folder's name, else config.json's
    /// `_name_or_path`.
    pub name: String,
    /// The architecture serving it: config.json's `model_type` (one of
    /// [`SUPPORTED_MODEL_TYPES`]).
    pub architecture: &'static str,
    /// What it is served for: embeddings, scores of pairs or labels, or
    /// sparse vectors.
    pub task: Task,
    /// Length of an embedding (the hidden size for every pooling supported).
    pub dim: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward inner size.
    pub intermediate: usize,
    /// Vocabulary size (config.json's).
    pub vocab: usize,
    /// The most tokens an input may have, `[CLS]` and `[SEP]` included:
    /// max_seq_length of sentence_bert_config.json (else tokenizer_config.json's
    /// model_max_length), within the positions the model has
    /// (max_position_embeddings, less RoBERTa's two of padding).
    pub max_len: usize,
    /// How token vectors are pooled.
    pub pooling: Pooling,
    /// Whether the pipeline ends in a Normalize module (modules.json): pass
    /// it to [`Model::embed`] for the model's own behaviour.
    pub normalize: bool,
    /// Bytes of weights the forward pass reads.
    pub weight_bytes: usize,
    /// Where the weights are mapped from (`MAP_SHARED`, read-only: every
    /// process that maps it shares its pages), when they are; `None` for a
    /// forward pass that holds its weights elsewhere.
    pub weights_file: Option<PathBuf>,
    /// Why this process wrote [`ModelInfo::weights_file`] (it was missing,
    /// stale or damaged); `None` when it found it valid.
    pub weights_built: Option<String>,
    /// The dense layers' compute type, `"float32"` or `"bfloat16"` (TEI's
    /// names; everything else computes in f32).
    pub dtype: &'static str,
    /// The dense layers' products, for `--doctor` (`"avx2+fma f32 panels,
    /// gemm"`, `"avx512-bf16"`, `"amx-bf16"`...); empty for a forward pass
    /// that runs elsewhere.
    pub kernels: &'static str,
    /// Compute threads per embed call ([`LoadOptions::threads`]).
    pub threads: usize,
}

/// A loaded model. `Send + Sync`: [`Model::embed`] and [`Model::tokenize`]
/// take `&self` and may run on several threads at once.
pub struct Model {
    info: ModelInfo,
    tokenizer: Tokenizer,
    encoder: Box<dyn arch::Encoder>,
    /// The classifier or SPLADE head ([`ModelInfo::task`]); None for an
    /// embedder.
    head: Option<heads::Loaded>,
    isa: kernels::Isa,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("info", &self.info)
            .field("isa", &self.isa)
            .finish_non_exhaustive()
    }
}

/// A folder's JSON files and tokenizer, read: all of it but the weights.
struct Folder {
    arch: Box<dyn arch::Architecture>,
    head: Option<heads::Head>,
    task: Task,
    pipe: config::PipelineConfig,
    max_len: usize,
    tokenizer: Tokenizer,
}

impl Folder {
    fn open(dir: &Path) -> Result<Folder, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::new(
                dir,
                "is not a folder",
                "point MODEL_DIR at a sentence-transformers model folder",
            ));
        }
        let registry::Chosen { arch, head, task } = registry::choose(dir)?;
        let pipe = match &head {
            None => config::pipeline_config(dir)?,
            Some(heads::Head::Classifier(_)) => config::task_pipeline(dir, Pooling::Cls)?,
            Some(heads::Head::Splade(_)) => config::task_pipeline(dir, Pooling::Max)?,
        };
        let dims = arch.dims();
        let max_len = pipe
            .max_seq_length
            .map_or(dims.max_tokens, |s| s.min(dims.max_tokens));
        let tokenizer = Tokenizer::load(dir, max_len, dims.vocab)?;
        Ok(Folder {
            arch,
            head,
            task,
            pipe,
            max_len,
            tokenizer,
        })
    }

    /// The pooling module's width against config.json's.
    fn check_pooling_dim(&self) -> Result<(), ModelError> {
        match self.pipe.pooling_dim {
            Some(d) if d != self.arch.dims().hidden => Err(ModelError::new(
                &self.pipe.pooling_file,
                format!(
                    "word_embedding_dimension is {d}, config.json's hidden_size is {}",
                    self.arch.dims().hidden
                ),
                error::FIX_REEXPORT,
            )),
            _ => Ok(()),
        }
    }

    fn info(
        &self,
        dir: &Path,
        name: Option<String>,
        weight_bytes: usize,
        threads: usize,
    ) -> ModelInfo {
        let folder = std::fs::canonicalize(dir)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let dims = self.arch.dims();
        let name = name
            .or(folder)
            .or(dims.name_or_path.clone())
            .unwrap_or_else(|| "model".into());
        ModelInfo {
            name,
            architecture: self.arch.name(),
            task: self.task.clone(),
            dim: dims.hidden,
            layers: dims.layers,
            hidden: dims.hidden,
            heads: dims.heads,
            intermediate: dims.intermediate,
            vocab: dims.vocab,
            max_len: self.max_len,
            pooling: self.pipe.pooling,
            normalize: self.pipe.normalize,
            weight_bytes,
            weights_file: None,
            weights_built: None,
            dtype: "float32",
            kernels: "",
            threads,
        }
    }
}

/// What a sentence-transformers folder says of its model, and its
/// tokenizer, without reading the weights (a StaticEmbedding folder's too:
/// `static_folder`): what a forward pass that runs
/// elsewhere (another runtime) needs around it. The folder is checked as
/// [`Model::load`] checks it, the weights aside; [`ModelInfo::weight_bytes`]
/// is 0 and [`ModelInfo::threads`] 1.
pub fn describe_folder(
    dir: &Path,
    name: Option<String>,
) -> Result<(ModelInfo, Tokenizer), ModelError> {
    if let Some(module) = static_folder::static_module(dir) {
        return static_folder::describe(dir, &module, name);
    }
    let folder = Folder::open(dir)?;
    folder.check_pooling_dim()?;
    let info = folder.info(dir, name, 0, 1);
    Ok((info, folder.tokenizer))
}

impl Model {
    /// Loads a sentence-transformers folder: `config.json`,
    /// `model.safetensors`, `tokenizer.json`, `modules.json`, the pooling
    /// module's `config.json` (at the path modules.json gives) and, if
    /// present, `sentence_bert_config.json`. Nothing is downloaded. The
    /// weights are mapped from the packed cache, written first when it is
    /// missing, stale or damaged (see the module docs);
    /// [`ModelInfo::weights_file`] says where it is.
    ///
    /// Refuses, naming the file at fault and the fix: a missing file, a
    /// model_type not in [`SUPPORTED_MODEL_TYPES`] (or one that needs
    /// trust_remote_code), a pipeline with modules other than
    /// Transformer, Pooling and Normalize, tensors whose shapes disagree
    /// with config.json (names with or without the architecture's prefix,
    /// `bert.` say, are both read), a damaged file.
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<Model, ModelError> {
        let precision = precision(opts.dtype).map_err(|why| {
            let (problem, fix) = why.rsplit_once("; ").unwrap_or((&why, ""));
            ModelError::new(dir, problem, fix)
        })?;
        Model::load_with(dir, opts, precision)
    }

    /// [`Model::load`] in bfloat16 with the portable reference kernel, on
    /// any CPU: for tests that prove the bf16 path (weights' layout,
    /// rounding, cache, accuracy) where the CPU has no bf16 instructions.
    /// Slow, and never what the server runs: its settings reach
    /// [`Model::load`] only. `opts.dtype` is ignored.
    #[doc(hidden)]
    pub fn load_bf16_reference(dir: &Path, opts: LoadOptions) -> Result<Model, ModelError> {
        Model::load_with(dir, opts, Precision::Bf16(Bf16Kernel::Portable))
    }

    fn load_with(dir: &Path, opts: LoadOptions, precision: Precision) -> Result<Model, ModelError> {
        if static_folder::static_module(dir).is_some() {
            return Err(ModelError::new(
                &dir.join("modules.json"),
                "starts with a StaticEmbedding: a table, not an encoder this forward pass serves",
                format!(
                    "serve it with a static-embedding backend: {}=/path/to/\
                     libstatic_embedding.so (built from backends/c/static_embedding.c)",
                    crate::settings::ENV_BACKEND
                ),
            ));
        }
        let folder = Folder::open(dir)?;
        let isa = kernels::Isa::detect();
        let mut tensors = folder.arch.tensors();
        let word = tensors.naming.anchor.clone();
        let hidden = folder.arch.dims().hidden;
        if let Some(head) = &folder.head {
            head.declare(&mut tensors, hidden);
        }
        let packed = cache::open(dir, tensors, opts.cache_dir.as_deref(), precision)?;
        let encoder = folder.arch.encoder(&packed, folder.max_len, isa);
        let head = folder
            .head
            .as_ref()
            .map(|h| h.load(&packed, hidden, &word, isa));
        // After the weights: when config.json disagrees with them, the
        // tensors' shapes tell more than the pooling module does.
        folder.check_pooling_dim()?;
        let threads = opts.threads.max(1);
        let mut info = folder.info(dir, opts.name, packed.bytes(), threads);
        info.weights_file = Some(packed.path.clone());
        info.weights_built = packed.built.clone();
        info.dtype = dtype_name(&precision);
        info.kernels = kernels_name(&precision, isa);
        Ok(Model {
            info,
            tokenizer: folder.tokenizer,
            encoder,
            head,
            isa,
        })
    }

    /// What the model is.
    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Tokenizes every text with the model's tokenizer: [`Tokenizer::tokenize`].
    pub fn tokenize(&self, texts: &[&str], truncate: bool) -> Result<Vec<Encoded>, TokenizeError> {
        self.tokenizer.tokenize(texts, truncate)
    }

    /// The embeddings of a batch: `batch.len() * info().dim` floats, row
    /// after row in the batch's order. `normalize` L2-normalises each row
    /// (pass `info().normalize` for the model's own pipeline). An empty
    /// input (no tokens) embeds as zeros.
    ///
    /// The batch runs as packed forward passes on [`LoadOptions::threads`]
    /// threads, one for every [`Model::groups`] of its inputs.
    pub fn embed(&self, batch: &[Encoded], normalize: bool) -> Vec<f32> {
        let dim = self.info.dim;
        let mut out = vec![0f32; batch.len() * dim];
        for g in self.groups(batch) {
            self.embed_group(&batch[g.clone()], &mut out[g.start * dim..g.end * dim]);
        }
        if normalize {
            normalize_rows(dim, &mut out);
        }
        out
    }

    /// `out` (`batch.len() * dim`) = the pooled rows of one pass.
    fn embed_group(&self, batch: &[Encoded], out: &mut [f32]) {
        let dim = self.info.dim;
        if self.info.pooling == Pooling::Cls
            && let Some(firsts) = self.first_states(batch)
        {
            out.copy_from_slice(&firsts);
            return;
        }
        let hidden = self.forward(batch);
        let mut row = 0;
        for (e, o) in batch.iter().zip(out.chunks_exact_mut(dim)) {
            let len = e.ids().len().min(self.info.max_len);
            pooling::pool(
                self.isa,
                self.info.pooling,
                &hidden[row * dim..(row + len) * dim],
                dim,
                o,
            );
            row += len;
        }
    }

    /// How many forward passes `batch` runs as ([`Model::groups`]).
    pub fn passes(&self, batch: &[Encoded]) -> usize {
        self.groups(batch).len()
    }

    /// The batch's inputs cut into consecutive groups, one forward pass
    /// each, of at most [`PASS_BYTES`] in a pass's widest buffer (tokens x
    /// the feed-forward's width, in f32); an input over it alone is a
    /// group. A pass's activations then stay in the CPU's caches and in
    /// the kept scratch (`mmap.rs`) however many requests a batch holds,
    /// and the sequences being independent, the result is the same.
    fn groups(&self, batch: &[Encoded]) -> Vec<std::ops::Range<usize>> {
        let width = self.info.intermediate.max(self.info.hidden).max(1);
        let most = (PASS_BYTES / (4 * width)).max(1);
        let mut groups = Vec::new();
        let (mut start, mut tokens) = (0, 0);
        for (i, e) in batch.iter().enumerate() {
            let t = e.tokens().min(self.info.max_len);
            if i > start && tokens + t > most {
                groups.push(start..i);
                (start, tokens) = (i, 0);
            }
            tokens += t;
        }
        if start < batch.len() {
            groups.push(start..batch.len());
        }
        groups
    }

    /// The encoder's last hidden state of every token of `batch`, before
    /// pooling: `sum(tokens) * info().dim` floats, the inputs' tokens one
    /// after another in order (what `/embed_all` answers).
    pub fn token_states(&self, batch: &[Encoded]) -> Vec<f32> {
        let mut out = Vec::new();
        for g in self.groups(batch) {
            // Copied out: the pass's scratch goes back when it is dropped.
            out.extend_from_slice(&self.forward(&batch[g]));
        }
        out
    }

    /// The embeddings of `batch` in one forward pass, cut into consecutive
    /// parts: `(n, normalize)` takes the next `n` inputs' rows, normalised
    /// or not. Part `k` is what `embed` of its inputs with its `normalize`
    /// gives, within float rounding: the pass is shared, so requests that
    /// differ in `normalize` need not wait for a pass each, and normalising
    /// a pooled row is the same step bit for bit either way.
    ///
    /// Panics unless the parts' `n` add up to `batch.len()`.
    pub fn embed_split(&self, batch: &[Encoded], parts: &[(usize, bool)]) -> Vec<Vec<f32>> {
        split_rows(&self.embed(batch, false), self.info.dim, parts)
    }

    /// The encoder's packed pass over `batch` on the model's threads.
    fn forward(&self, batch: &[Encoded]) -> mmap::Scratch {
        let (seqs, second) = encoder_inputs(batch);
        let pass = team::Pass::begin(self.info.threads);
        self.encoder.forward(&seqs, &second, &pass)
    }

    /// Each input's first token's last hidden state, `batch.len() x dim`,
    /// from the encoder's shortcut ([`Encoder::forward_first`]); `None`
    /// when the encoder has none or an input has no tokens (the caller
    /// runs the whole pass).
    fn first_states(&self, batch: &[Encoded]) -> Option<mmap::Scratch> {
        if batch.iter().any(|e| e.ids().is_empty()) {
            return None;
        }
        let (seqs, second) = encoder_inputs(batch);
        let pass = team::Pass::begin(self.info.threads);
        self.encoder.forward_first(&seqs, &second, &pass)
    }

    /// Each input's tokens in the pass (cut at max_len, as the encoder
    /// cuts them).
    fn lens(&self, batch: &[Encoded]) -> Vec<usize> {
        batch
            .iter()
            .map(|e| e.tokens().min(self.info.max_len))
            .collect()
    }

    /// The classifier head's logits for a batch of a cross-encoder
    /// ([`Task::Classify`]): `batch.len() * labels` floats, row after row
    /// in the batch's order, raw (no sigmoid or softmax). Inputs come from
    /// [`Tokenizer::tokenize_pairs`] (or [`Tokenizer::tokenize`] for one
    /// text); the packed pass gives each token its own token type. Pairs
    /// and single texts may share a batch.
    ///
    /// Panics when the model is not a cross-encoder: route by
    /// [`ModelInfo::task`] first.
    pub fn classify(&self, batch: &[Encoded]) -> Vec<f32> {
        let Some(heads::Loaded::Classifier(head)) = &self.head else {
            panic!(
                "Model::classify on a {} model: only Task::Classify models have a classifier head",
                self.info.task.kind()
            );
        };
        if batch.is_empty() {
            return Vec::new();
        }
        let mut logits = Vec::new();
        for g in self.groups(batch) {
            let batch = &batch[g];
            if head.reads_first_token_only()
                && let Some(firsts) = self.first_states(batch)
            {
                logits.extend(head.logits(&firsts, &vec![1; batch.len()]));
                continue;
            }
            let hidden = self.forward(batch);
            logits.extend(head.logits(&hidden, &self.lens(batch)));
        }
        logits
    }

    /// The sparse vectors of a batch of a SPLADE model ([`Task::Sparse`]):
    /// per input, its nonzero `(vocabulary index, value)` entries in
    /// ascending index, value = max over tokens of log(1 + relu(logit))
    /// (or the sum, or log1p twice, as the folder's SpladePooling says).
    ///
    /// Panics when the model is not a SPLADE model: route by
    /// [`ModelInfo::task`] first.
    pub fn sparse(&self, batch: &[Encoded]) -> Vec<Vec<(u32, f32)>> {
        let Some(heads::Loaded::Splade(head)) = &self.head else {
            panic!(
                "Model::sparse on a {} model: only Task::Sparse models have a SPLADE head",
                self.info.task.kind()
            );
        };
        let mut vectors = Vec::with_capacity(batch.len());
        for g in self.groups(batch) {
            let batch = &batch[g];
            let hidden = self.forward(batch);
            let lens = self.lens(batch);
            let pass = team::Pass::begin(self.info.threads);
            vectors.extend(head.vectors(&hidden, &lens, pass.threads()));
        }
        vectors
    }

    /// FLOPs of the dense layers for a batch of `tokens` tokens in all (for
    /// benchmarks: attention, norms and GELU not counted).
    pub fn dense_flops(&self, tokens: usize) -> f64 {
        self.encoder.dense_flops(tokens)
    }
}

/// What an [`arch::Encoder`] pass takes of a batch: each input's token ids, and
/// where its second text starts.
fn encoder_inputs(batch: &[Encoded]) -> (Vec<&[u32]>, Vec<usize>) {
    let seqs = batch.iter().map(|e| e.ids()).collect();
    let second = batch.iter().map(Encoded::second).collect();
    (seqs, second)
}

/// The most bytes of a forward pass's widest buffer (tokens x the
/// feed-forward's width, f32) before a batch is cut into several passes
/// ([`Model::groups`]): 1,024 tokens of MiniLM, 512 of a 768-wide base
/// model. Past that the activations outgrow the CPU's caches, with no more
/// rows to win for the products.
const PASS_BYTES: usize = 6 << 20;

/// L2-normalises each `dim`-float row of `rows` in place, as
/// torch.nn.functional.normalize does (a zero row stays zero), with the
/// same kernels, so the same bits, as [`Model::embed`].
pub fn normalize_rows(dim: usize, rows: &mut [f32]) {
    let isa = kernels::Isa::detect();
    for row in rows.chunks_exact_mut(dim) {
        pooling::normalize(isa, row);
    }
}

/// Cuts un-normalized `rows` (`dim` floats each) into consecutive parts:
/// `(n, normalize)` takes the next `n` rows, normalised or not.
///
/// Panics unless the parts' `n` add up to the rows.
pub fn split_rows(rows: &[f32], dim: usize, parts: &[(usize, bool)]) -> Vec<Vec<f32>> {
    let total: usize = parts.iter().map(|&(n, _)| n).sum();
    assert_eq!(total * dim, rows.len(), "the parts cover the batch exactly");
    let mut rest = rows;
    parts
        .iter()
        .map(|&(n, normalize)| {
            let (mine, tail) = rest.split_at(n * dim);
            rest = tail;
            let mut mine = mine.to_vec();
            if normalize {
                normalize_rows(dim, &mut mine);
            }
            mine
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Model>();
    }
}
