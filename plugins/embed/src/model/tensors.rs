//! What an architecture declares of its weights, once: the tensors of the
//! packed cache, in order, each with where in model.safetensors it comes
//! from. The cache (cache.rs) packs and checks exactly this list and names
//! no tensor itself; the architecture then takes its tensors from the
//! mapped cache by the same names.

use super::layers::linear::PANEL;

/// Where a tensor of the cache comes from in model.safetensors (names
/// without the file's prefix).
pub(crate) enum Origin {
    /// `take` floats of tensor `name` from float `skip` on, whose shape
    /// must be `shape`.
    Rows {
        name: String,
        shape: Vec<usize>,
        skip: usize,
        take: usize,
    },
    /// The `[n, k]` weights `{name}.weight` of these layers (name, n),
    /// stacked along n, in panels of [`PANEL`] columns.
    Panels {
        parts: Vec<(String, usize)>,
        k: usize,
    },
    /// The same layers' biases `{name}.bias`, one after the other.
    Biases(Vec<(String, usize)>),
    /// Zeros: the bias of a layer that has none, the shift of a norm
    /// without one (ModernBERT), so the kernels need no second form.
    Zeros,
}

/// One tensor of the cache.
pub(crate) struct Declared {
    /// Its name in the cache's table.
    pub name: String,
    /// Its shape in the cache: as in the file for rows, `[panels, k,
    /// PANEL]` for a dense layer's weight.
    pub shape: Vec<usize>,
    /// Real output columns of a panel layout; None for rows.
    pub columns: Option<usize>,
    /// Floats.
    pub len: usize,
    pub origin: Origin,
    /// Its origin's names are the file's own, not under the base model's
    /// prefix: a task model's head (`classifier.weight` beside
    /// `bert.embeddings...`).
    pub root: bool,
}

/// How an architecture's tensors are named in model.safetensors.
#[derive(Debug, Clone)]
pub(crate) struct Naming {
    /// The architecture, for messages (`bert`, `distilbert`...).
    pub arch: &'static str,
    /// A tensor every file of the architecture has, without prefix: which
    /// of `prefixes` (or none) the file uses is decided by it.
    pub anchor: String,
    /// Prefixes the names may carry: a task model's base model, saved by
    /// `XForMaskedLM` and kin (`bert.`, `roberta.`, `distilbert.`).
    pub prefixes: &'static [&'static str],
}

/// An architecture's tensors, in the cache's order.
pub(crate) struct TensorList {
    pub naming: Naming,
    pub tensors: Vec<Declared>,
    /// Whether tensors declared now are named at the file's root
    /// ([`TensorList::at_root`]).
    root: bool,
}

impl TensorList {
    pub(crate) fn new(naming: Naming) -> TensorList {
        TensorList {
            naming,
            tensors: Vec::new(),
            root: false,
        }
    }

    /// Tensors declared from now on are read by their names in the file
    /// as they are, without the base model's prefix (a task model's head:
    /// `classifier.weight`, `cls.predictions.bias`), and keep those names
    /// in the cache.
    pub(crate) fn at_root(&mut self) {
        self.root = true;
    }

    fn push(&mut self, name: String, shape: Vec<usize>, columns: Option<usize>, origin: Origin) {
        let len = shape.iter().product();
        self.tensors.push(Declared {
            name,
            shape,
            columns,
            len,
            origin,
            root: self.root,
        });
    }

    /// Tensor `name` as it is in the file, of `shape`.
    pub(crate) fn rows(&mut self, name: &str, shape: Vec<usize>) {
        let take = shape.iter().product();
        let origin = Origin::Rows {
            name: name.into(),
            shape: shape.clone(),
            skip: 0,
            take,
        };
        self.push(name.into(), shape, None, origin);
    }

    /// Row `row` of `src` (of `src_shape`, rows of `src_shape[1]`), as
    /// `name` (BERT's token type 0, and type 1 for pairs).
    pub(crate) fn one_row(&mut self, name: &str, src: &str, src_shape: Vec<usize>, row: usize) {
        let width = src_shape.get(1).copied().unwrap_or(0);
        let origin = Origin::Rows {
            name: src.into(),
            shape: src_shape,
            skip: row * width,
            take: width,
        };
        self.push(name.into(), vec![width], None, origin);
    }

    /// A dense layer as `{name}.weight` (panels) and `{name}.bias`, from
    /// `parts`, layers `(source name, n)` of `[n, k]` weights stacked
    /// along n (query, key and value into one product, say).
    pub(crate) fn dense(&mut self, name: &str, parts: Vec<(String, usize)>, k: usize) {
        self.dense_weight(name, &parts, k);
        let n: usize = parts.iter().map(|(_, n)| n).sum();
        self.push(format!("{name}.bias"), vec![n], None, Origin::Biases(parts));
    }

    /// [`TensorList::dense`] of layers without biases: `{name}.bias` is
    /// zeros.
    pub(crate) fn dense_without_bias(&mut self, name: &str, parts: Vec<(String, usize)>, k: usize) {
        self.dense_weight(name, &parts, k);
        let n: usize = parts.iter().map(|(_, n)| n).sum();
        self.push(format!("{name}.bias"), vec![n], None, Origin::Zeros);
    }

    fn dense_weight(&mut self, name: &str, parts: &[(String, usize)], k: usize) {
        let n: usize = parts.iter().map(|(_, n)| n).sum();
        let panels = n.div_ceil(PANEL);
        self.push(
            format!("{name}.weight"),
            vec![panels, k, PANEL],
            Some(n),
            Origin::Panels {
                parts: parts.to_vec(),
                k,
            },
        );
    }

    /// A LayerNorm `name`: `{name}.weight` and `{name}.bias`, `[width]`.
    pub(crate) fn norm(&mut self, name: &str, width: usize) {
        for part in ["weight", "bias"] {
            self.rows(&format!("{name}.{part}"), vec![width]);
        }
    }

    /// A LayerNorm without a shift: `{name}.bias` is zeros.
    pub(crate) fn norm_without_bias(&mut self, name: &str, width: usize) {
        self.rows(&format!("{name}.weight"), vec![width]);
        self.push(format!("{name}.bias"), vec![width], None, Origin::Zeros);
    }
}
