//! The model's own `tokenizer.json`, through the `tokenizers` crate, with
//! its padding removed (sequences are packed, never padded) and its
//! truncation replaced by the model's max_len.
//!
//! Whatever the family's tokenizer is (WordPiece with `[CLS]`/`[SEP]`,
//! SentencePiece Unigram with Metaspace or byte-level BPE with `<s>`/`</s>`
//! for the RoBERTa family), tokenizer.json describes it whole and the
//! `tokenizers` crate runs it; the docs below say `[CLS]` and `[SEP]` for
//! whatever special tokens its post-processor adds.

use super::error::ModelError;
use std::fmt;
use std::path::Path;
use tokenizers::{
    EncodeInput, PostProcessor, Tokenizer as HfTokenizer, TruncationDirection as HfDirection,
    TruncationParams,
};

/// Which end of an over-long input truncation cuts; the special tokens
/// (`[CLS]`, `[SEP]`) stay either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Keep the start, cut the end (sentence-transformers' way).
    Right,
    /// Keep the end, cut the start.
    Left,
}

/// One token of a text as `/tokenize` reports it: its id, its text (the
/// input's bytes it covers, or the token itself for a special token), and
/// for ordinary tokens its byte offsets in the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSpan {
    pub id: u32,
    pub text: String,
    pub special: bool,
    /// Byte offsets `start..stop` in the input; `None` for special tokens.
    pub span: Option<(usize, usize)>,
}

/// One tokenized input: its token ids, `[CLS]` and `[SEP]` included.
///
/// Made only by [`Tokenizer::tokenize`] and [`Tokenizer::from_ids`], so
/// its ids are in the model's vocabulary and its length within `max_len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    ids: Vec<u32>,
    /// Where the second text of a pair starts: the first token whose
    /// token type is 1 (`ids.len()` for one text, and for tokenizers whose
    /// pairs keep type 0 throughout, as XLM-RoBERTa's).
    second: usize,
}

impl Encoded {
    /// The token ids, `[CLS]` and `[SEP]` included.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The number of tokens, `[CLS]` and `[SEP]` included (what usage
    /// counts report as prompt tokens).
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// The index of the first token of token type 1 (the second text of a
    /// pair, for tokenizers that type it); [`Encoded::tokens`] when every
    /// token is of type 0.
    pub fn second(&self) -> usize {
        self.second
    }

    pub(crate) fn one(ids: Vec<u32>) -> Encoded {
        let second = ids.len();
        Encoded { ids, second }
    }
}

/// An input longer than the model takes, refused because truncation was off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong {
    /// The input's index in the batch.
    pub index: usize,
    /// Its length in tokens, `[CLS]` and `[SEP]` included.
    pub tokens: usize,
    /// The most the model takes ([`ModelInfo::max_len`](super::ModelInfo::max_len)).
    pub max: usize,
}

impl fmt::Display for TooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "input {} is {} tokens long, more than the model's {}",
            self.index, self.tokens, self.max
        )
    }
}

impl std::error::Error for TooLong {}

/// Why [`Tokenizer::tokenize`] refused a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizeError {
    /// An input is longer than max_len and truncation was off (a client's
    /// error: HTTP 413 or 400).
    TooLong(TooLong),
    /// The tokenizer itself failed on input `index` (not seen with WordPiece
    /// on any UTF-8 text; a server error).
    Failed {
        /// The input's index in the batch.
        index: usize,
        /// The tokenizer's message.
        message: String,
    },
}

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizeError::TooLong(t) => t.fmt(f),
            TokenizeError::Failed { index, message } => {
                write!(f, "input {index} could not be tokenized: {message}")
            }
        }
    }
}

impl std::error::Error for TokenizeError {}

impl From<TooLong> for TokenizeError {
    fn from(t: TooLong) -> Self {
        TokenizeError::TooLong(t)
    }
}

/// A model folder's tokenizer (from [`Model::load`](super::Model::load) or
/// [`describe_folder`](super::describe_folder)), twice: truncating at
/// max_len, and not truncating. `Send + Sync`: it tokenizes on several
/// threads at once.
#[derive(Clone)]
pub struct Tokenizer {
    truncating: HfTokenizer,
    /// As `truncating`, cutting at the start instead.
    truncating_left: HfTokenizer,
    whole: HfTokenizer,
    /// The special ids the post-processor starts a sequence with
    /// (`[CLS]`): [`Tokenizer::from_ids`] keeps them when it cuts at the
    /// start.
    prefix: Vec<u32>,
    max_len: usize,
    /// config.json's `vocab_size`: the rows of the embedding table, so the
    /// bound every id must be under.
    vocab: usize,
    /// The special ids the post-processor ends a sequence with (`[SEP]`):
    /// [`Tokenizer::from_ids`] keeps them when it truncates, as truncating
    /// text does.
    suffix: Vec<u32>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("max_len", &self.max_len)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    pub(crate) fn load(dir: &Path, max_len: usize, vocab: usize) -> Result<Tokenizer, ModelError> {
        Tokenizer::load_with(dir, max_len, vocab, true)
    }

    /// [`Tokenizer::load`], with or without the post-processor's special
    /// tokens: a static embedding model (static_folder.rs) encodes with
    /// `add_special_tokens=False`, which is the same as having none.
    pub(crate) fn load_with(
        dir: &Path,
        max_len: usize,
        vocab: usize,
        special_tokens: bool,
    ) -> Result<Tokenizer, ModelError> {
        let file = dir.join("tokenizer.json");
        if !file.is_file() {
            return Err(ModelError::new(
                &file,
                "file is missing",
                "put the model's fast-tokenizer file (tokenizer.json) in MODEL_DIR; \
                 sentence-transformers saves one with the model",
            ));
        }
        let mut whole = HfTokenizer::from_file(&file).map_err(|e| {
            ModelError::new(
                &file,
                format!("cannot be read as a tokenizer: {e}"),
                "restore tokenizer.json from the model's original folder",
            )
        })?;
        let tv = whole.get_vocab_size(true);
        if tv > vocab {
            return Err(ModelError::new(
                &file,
                format!("has {tv} tokens, more than config.json's vocab_size {vocab}"),
                "use the tokenizer.json saved with this model",
            ));
        }
        // Packed sequences need no padding; the file's fixed padding to 128
        // would only add work and change mean pooling.
        whole.with_padding(None);
        let _ = whole.with_truncation(None);
        if !special_tokens {
            whole.with_post_processor(None::<tokenizers::PostProcessorWrapper>);
        }
        let added = whole
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if max_len <= added {
            return Err(ModelError::new(
                &dir.join("sentence_bert_config.json"),
                format!("max_seq_length {max_len} leaves no room beside {added} special tokens"),
                "set max_seq_length to the model's (256 for all-MiniLM-L6-v2)",
            ));
        }
        // The same tokenizer cutting at max_len, from the end or the start.
        let cutting = |direction: HfDirection| {
            let mut t = whole.clone();
            t.with_truncation(Some(TruncationParams {
                max_length: max_len,
                direction,
                ..TruncationParams::default()
            }))
            .map_err(|e| {
                ModelError::new(
                    &file,
                    format!("refuses truncation at {max_len}: {e}"),
                    "restore tokenizer.json from the model's original folder",
                )
            })?;
            Ok::<_, ModelError>(t)
        };
        let truncating = cutting(HfDirection::Right)?;
        let truncating_left = cutting(HfDirection::Left)?;
        // What the post-processor adds: the special ids before the first
        // and after the last ordinary one of a one-word text.
        let (prefix, suffix) = whole
            .encode_fast("a", true)
            .map(|e| {
                let specials = e.get_special_tokens_mask();
                let ids = e.get_ids();
                let first = specials.iter().position(|&m| m == 0);
                let last = specials.iter().rposition(|&m| m == 0);
                match (first, last) {
                    (Some(f), Some(l)) => (ids[..f].to_vec(), ids[l + 1..].to_vec()),
                    _ => (Vec::new(), Vec::new()),
                }
            })
            .unwrap_or_default();
        Ok(Tokenizer {
            truncating,
            truncating_left,
            prefix,
            whole,
            max_len,
            vocab,
            suffix,
        })
    }

    /// Ids in the vocabulary: every id is below this.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// Token-id sequences a client made with this model's tokenizer, taken
    /// as they are (no special tokens added: send them as the tokenizer
    /// gives them, `[CLS]` and `[SEP]` included). An id outside the
    /// vocabulary fails the batch with [`TokenizeError::Failed`] (the API
    /// layer refuses those first, naming the id). Over-long sequences
    /// follow text's rules: without `truncate` the first fails the batch
    /// with [`TokenizeError::TooLong`]; with it, each is cut to max_len,
    /// keeping its closing special tokens when it ends with them, so ids of
    /// a long text cut as the text itself would be.
    pub fn from_ids(
        &self,
        seqs: &[Vec<u32>],
        truncate: bool,
    ) -> Result<Vec<Encoded>, TokenizeError> {
        self.from_ids_cut(seqs, truncate.then_some(Side::Right))
    }

    /// [`Tokenizer::from_ids`], cutting over-long sequences at `cut`'s
    /// end (keeping the opening special tokens too when cutting the
    /// start), or refusing them when `cut` is `None`.
    pub fn from_ids_cut(
        &self,
        seqs: &[Vec<u32>],
        cut: Option<Side>,
    ) -> Result<Vec<Encoded>, TokenizeError> {
        let mut out = Vec::with_capacity(seqs.len());
        for (index, ids) in seqs.iter().enumerate() {
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
                return Err(TokenizeError::Failed {
                    index,
                    message: format!(
                        "token id {bad} is outside the vocabulary of {} ids",
                        self.vocab
                    ),
                });
            }
            if ids.len() <= self.max_len {
                out.push(Encoded::one(ids.clone()));
                continue;
            }
            let Some(side) = cut else {
                return Err(TooLong {
                    index,
                    tokens: ids.len(),
                    max: self.max_len,
                }
                .into());
            };
            let keep_end = if !self.suffix.is_empty() && ids.ends_with(&self.suffix) {
                self.suffix.len()
            } else {
                0
            };
            let keep_start = if !self.prefix.is_empty() && ids.starts_with(&self.prefix) {
                self.prefix.len()
            } else {
                0
            };
            let kept = match side {
                Side::Right => {
                    let mut kept = ids[..self.max_len - keep_end].to_vec();
                    kept.extend_from_slice(&ids[ids.len() - keep_end..]);
                    kept
                }
                Side::Left => {
                    let mut kept = ids[..keep_start].to_vec();
                    kept.extend_from_slice(&ids[ids.len() - (self.max_len - keep_start)..]);
                    kept
                }
            };
            out.push(Encoded::one(kept));
        }
        Ok(out)
    }

    /// The most tokens an input may have, `[CLS]` and `[SEP]` included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Tokenizes every text, `[CLS]` and `[SEP]` added, never padded. With
    /// `truncate`, inputs longer than max_len are cut to it (as
    /// sentence-transformers does); without, the first such input fails the
    /// batch with [`TokenizeError::TooLong`].
    pub fn tokenize(&self, texts: &[&str], truncate: bool) -> Result<Vec<Encoded>, TokenizeError> {
        self.tokenize_cut(texts, truncate.then_some(Side::Right))
    }

    /// [`Tokenizer::tokenize`], cutting over-long inputs at `cut`'s end
    /// (the special tokens kept), or refusing them when `cut` is `None`.
    pub fn tokenize_cut(
        &self,
        texts: &[&str],
        cut: Option<Side>,
    ) -> Result<Vec<Encoded>, TokenizeError> {
        let tok = match cut {
            Some(Side::Right) => &self.truncating,
            Some(Side::Left) => &self.truncating_left,
            None => &self.whole,
        };
        self.encode_each(tok, texts.iter().copied())
    }

    /// Tokenizes (query, text) pairs as the model's tokenizer encodes a pair
    /// (`[CLS] a [SEP] b [SEP]` with token types 0 and 1 for BERT,
    /// `<s> a </s></s> b </s>` for XLM-RoBERTa), never padded. With
    /// `truncate`, a pair longer than max_len is cut longest first (the
    /// longer text loses a token at a time from its end), as
    /// sentence-transformers' CrossEncoder does; without, the first such
    /// pair fails the batch with [`TokenizeError::TooLong`].
    pub fn tokenize_pairs(
        &self,
        pairs: &[(&str, &str)],
        truncate: bool,
    ) -> Result<Vec<Encoded>, TokenizeError> {
        // TruncationParams::default()'s strategy is LongestFirst.
        let tok = if truncate {
            &self.truncating
        } else {
            &self.whole
        };
        self.encode_each(tok, pairs.iter().copied())
    }

    /// Encodes each input (a text or a pair) with `tok`, special tokens
    /// added, refusing the first longer than max_len: what
    /// [`Tokenizer::tokenize_cut`] and [`Tokenizer::tokenize_pairs`] share.
    fn encode_each<'s, E: Into<EncodeInput<'s>>>(
        &self,
        tok: &HfTokenizer,
        inputs: impl ExactSizeIterator<Item = E>,
    ) -> Result<Vec<Encoded>, TokenizeError> {
        let mut out = Vec::with_capacity(inputs.len());
        for (index, input) in inputs.enumerate() {
            let enc = tok
                .encode_fast(input, true)
                .map_err(|e| TokenizeError::Failed {
                    index,
                    message: e.to_string(),
                })?;
            let ids = enc.get_ids();
            if ids.len() > self.max_len {
                return Err(TooLong {
                    index,
                    tokens: ids.len(),
                    max: self.max_len,
                }
                .into());
            }
            // One text is all type 0, so `second` is its length.
            let second = enc
                .get_type_ids()
                .iter()
                .position(|&t| t != 0)
                .unwrap_or(ids.len());
            out.push(Encoded {
                ids: ids.to_vec(),
                second,
            });
        }
        Ok(out)
    }

    /// The tokens of `text`, with `add_special_tokens` the model's
    /// `[CLS]`/`[SEP]` too, never truncated: what `/tokenize` answers.
    /// Offsets are bytes of `text`, as TEI answers them: `encode` computes
    /// byte offsets (`encode_char_offsets` would count chars, and
    /// `encode_fast`, which the embedding routes use since they need none,
    /// leaves every offset at 0..0), so only this route pays for them.
    pub fn spans(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenSpan>, TokenizeError> {
        let enc =
            self.whole
                .encode(text, add_special_tokens)
                .map_err(|e| TokenizeError::Failed {
                    index: 0,
                    message: e.to_string(),
                })?;
        let spans = enc
            .get_ids()
            .iter()
            .zip(enc.get_offsets())
            .zip(enc.get_special_tokens_mask())
            .zip(enc.get_tokens())
            .map(|(((&id, &(start, stop)), &special), token)| {
                if special == 1 {
                    TokenSpan {
                        id,
                        text: token.clone(),
                        special: true,
                        span: None,
                    }
                } else {
                    let bytes = text.as_bytes().get(start..stop).unwrap_or_default();
                    TokenSpan {
                        id,
                        text: String::from_utf8_lossy(bytes).into_owned(),
                        special: false,
                        span: Some((start, stop)),
                    }
                }
            })
            .collect();
        Ok(spans)
    }

    /// The text of token ids (ids of this vocabulary), special tokens
    /// dropped with `skip_special_tokens`: what `/decode` answers.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, String> {
        self.whole
            .decode(ids, skip_special_tokens)
            .map_err(|e| e.to_string())
    }
}
