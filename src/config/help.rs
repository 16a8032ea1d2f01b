//! The text after the flags in `-h` (short: what a first reader needs) and
//! `--help` (long: every exit code, the plugins' own settings, examples).

pub const AFTER_SHORT: &str = "\
Exit codes: 0 stopped, 1 startup failure, 2 usage error, 3 stopped with requests cut off, \
78 configuration refused.
`m0serve --help` shows every flag with its details, the M0_EMBED_* settings and examples; \
`m0serve --doctor ...` what a configuration would run.";

pub const AFTER_LONG: &str = "\
Every flag but --api-key, --api-key-open-path and --doctor has the M0_* variable shown \
beside it; a flag beats its variable, which beats the default.

Exit codes:
  0   stopped cleanly
  1   startup failure: a plugin not found or failing to start, a port in use
  2   usage error: a flag, or its M0_* variable, that does not parse
  3   stopped as asked, but --graceful-timeout cut requests in flight off
  78  configuration refused: a plugin of another ABI, a plugin that refuses its
      argument or settings, a --venv that is not one, an exec failure

The embed and pyembed plugins read M0_EMBED_* variables (the README's
\"Sentence embeddings\" section has each with its default):
  M0_EMBED_THREADS                most compute threads of one forward pass (default: the worker's CPUs)
  M0_EMBED_MAX_BATCH_REQUESTS     requests embedded together
  M0_EMBED_MAX_BATCH_BYTES        body bytes in such a batch
  M0_EMBED_MAX_CLIENT_BATCH_SIZE  inputs in one request on TEI's routes
  M0_EMBED_MAX_OPENAI_INPUTS      inputs in one /v1/embeddings request
  M0_EMBED_MAX_COHERE_DOCUMENTS   documents in one /v1/rerank or /v2/rerank request
  M0_EMBED_MAX_CONCURRENT_INPUTS  inputs a worker holds in flight before it answers 429
  M0_EMBED_PAYLOAD_LIMIT          largest body in bytes
  M0_EMBED_AUTO_TRUNCATE          cut over-long inputs when a request does not say
  M0_EMBED_ACCEPT_TOKEN_IDS       embed token-id inputs instead of refusing them
  M0_EMBED_SERVED_MODEL_NAME      the model name the APIs answer with
  M0_EMBED_DEFAULT_PROMPT_NAME    a prompt of the model for inputs that name none
  M0_EMBED_DEFAULT_PROMPT         a prompt text for inputs that name none
  M0_EMBED_CACHE_DIR              where the packed weights go when the model folder is read-only
  M0_EMBED_MODEL_DIR              pyembed's model folder
  M0_EMBED_BACKEND                embed's forward pass in a library of include/m0embed_backend.h
  M0_EMBED_DTYPE                  auto (bfloat16 where the CPU has AMX-BF16 or AVX512-BF16), float32 or bfloat16
pyembed also reads M0_PYEMBED_GIL and its backend's M0_PYEMBED_* settings.

Examples:
  m0serve --plugin hello_c
  m0serve --plugin wsgi -w 2 -b 0.0.0.0:8000 myproject.wsgi:application
  m0serve --plugin embed --model-id ./all-MiniLM-L6-v2
  m0serve --doctor --plugin wsgi --venv .venv myapp:app
  m0serve completions bash > ~/.local/share/bash-completion/completions/m0serve";
