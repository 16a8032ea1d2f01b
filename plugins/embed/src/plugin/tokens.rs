//! `POST /tokenize` and `POST /decode`: the model's tokenizer, no forward
//! pass, answered where they are read.

use m0serve_plugin::{Error, Request, Response, Sent};

use super::{JSON, Served, fail};
use crate::api::{self, ApiError, Flavor};
use crate::backend::Backend;

impl<B: Backend> Served<B> {
    /// `POST /tokenize`: each input's tokens, with their byte offsets.
    pub(super) fn tokenize(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let run = || -> Result<Vec<u8>, ApiError> {
            let body = self.body(req, Flavor::Tei)?;
            let call = api::parse_tokenize(&body, &self.limits)?;
            let prompt = self.prompt(call.prompt_name.as_deref(), Flavor::Tei)?;
            let tokenizer = self.backend.tokenizer();
            let mut all = Vec::with_capacity(call.inputs.len());
            for (index, text) in call.inputs.iter().enumerate() {
                let text = match prompt {
                    Some(p) => format!("{p}{text}"),
                    None => text.clone(),
                };
                let spans = tokenizer
                    .spans(&text, call.add_special_tokens)
                    .map_err(|e| {
                        ApiError::tokenizer(
                            Flavor::Tei,
                            &format!("input {index} could not be tokenized: {e}"),
                        )
                    })?;
                all.push(spans);
            }
            let mut out = Vec::new();
            api::write_tokens(
                all.iter().map(|spans| {
                    spans
                        .iter()
                        .map(|t| api::TokenOut {
                            id: t.id,
                            text: &t.text,
                            special: t.special,
                            span: t.span,
                        })
                        .collect()
                }),
                &mut out,
            );
            Ok(out)
        };
        match run() {
            Ok(out) => resp.send(200, &[JSON], &out),
            Err(e) => fail(resp, &e),
        }
    }

    /// `POST /decode`: each id list's text.
    pub(super) fn decode(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let run = || -> Result<Vec<u8>, ApiError> {
            let body = self.body(req, Flavor::Tei)?;
            let call = api::parse_decode(&body, &self.limits)?;
            let tokenizer = self.backend.tokenizer();
            let texts = call
                .ids
                .iter()
                .enumerate()
                .map(|(index, ids)| {
                    tokenizer
                        .decode(ids, call.skip_special_tokens)
                        .map_err(|e| {
                            ApiError::tokenizer(
                                Flavor::Tei,
                                &format!("ids {index} could not be decoded: {e}"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = Vec::new();
            api::write_decoded(&texts, &mut out);
            Ok(out)
        };
        match run() {
            Ok(out) => resp.send(200, &[JSON], &out),
            Err(e) => fail(resp, &e),
        }
    }
}
