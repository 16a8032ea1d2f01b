//! The one error type of loading a model folder.

use std::fmt;
use std::path::{Path, PathBuf};

/// Why a model folder could not be loaded: the file at fault, what is wrong
/// with it, and what to do about it.
///
/// Every cause is the folder's (a missing file, another architecture, shapes
/// that disagree with `config.json`, a file that is not what its name says),
/// so the server treats it as a configuration error (it exits 78,
/// `EX_CONFIG`). `Display` prints all three parts on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// The file at fault (or the folder itself when it is the folder).
    pub file: PathBuf,
    /// What is wrong, in one sentence.
    pub message: String,
    /// What to do about it, in one sentence.
    pub fix: String,
}

impl ModelError {
    pub(crate) fn new(file: &Path, message: impl Into<String>, fix: impl Into<String>) -> Self {
        ModelError {
            file: file.to_path_buf(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}; fix: {}",
            self.file.display(),
            self.message,
            self.fix
        )
    }
}

impl std::error::Error for ModelError {}

/// The fix for a file that does not match the rest of the folder.
pub(crate) const FIX_REEXPORT: &str = "use the folder exactly as sentence-transformers saved it \
     (SentenceTransformer.save), with config.json and model.safetensors from the same model";
