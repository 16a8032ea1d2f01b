//! The served models by name, and how a request finds its model: decided
//! once, here, for every route.
//!
//! - `/models/{name}/<route>`: the model the path names, whatever the
//!   route (a TEI client's base URL picks it); an unknown name is a 404
//!   listing the served names.
//! - OpenAI's `/v1/embeddings` and Cohere's `/v1/rerank`, `/v2/rerank`: the
//!   body's `model`. With one model any name is taken (clients send their
//!   own defaults); with several, an unknown name is a 404 and a model of
//!   another kind a 400, each in the route's own error shape; no `model`
//!   is the first model that answers the route.
//! - Every other route (TEI's): the first model that answers it (`/embed`
//!   the first embedder, `/rerank` the first reranker), else the first
//!   model, whose kind then answers 424 as TEI does.
//!
//! A model is given on the command line as `DIR` or `NAME=DIR`
//! ([`ModelArg`]).

use crate::api::{self, ApiError, ModelKind, Route};

/// One model ARG: `NAME=DIR`, or `DIR` (served under the name its folder
/// gives).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelArg {
    pub name: Option<String>,
    pub dir: String,
}

impl ModelArg {
    /// Reads `NAME=DIR` or `DIR`: a `=` before any `/` splits a name off
    /// (a folder whose name holds `=` is given with a `./` in front).
    pub fn parse(arg: &str) -> ModelArg {
        match arg.split_once('=') {
            Some((name, dir)) if !name.contains('/') && !name.is_empty() => ModelArg {
                name: Some(name.to_string()),
                dir: dir.to_string(),
            },
            _ => ModelArg {
                name: None,
                dir: arg.to_string(),
            },
        }
    }
}

/// Whether `name` can be served: what the host's model registry and the
/// `/models/{name}/` paths take (1 to 128 bytes of visible ASCII, no `"`
/// or `\`). `Err` says why not.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 128 {
        return Err(format!(
            "a model's name is 1 to 128 bytes, and `{name}` is {}",
            name.len()
        ));
    }
    match name
        .bytes()
        .find(|&b| !b.is_ascii_graphic() || b == b'"' || b == b'\\')
    {
        Some(b) => Err(format!(
            "a model's name is visible ASCII without `\"` or `\\`, and `{}` has {:?}",
            name.escape_default(),
            b as char
        )),
        None => Ok(()),
    }
}

/// Where a request goes: the model (its index in the served list) and the
/// route, as [`api::resolve`] gives it for that model's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub model: usize,
    pub route: Route,
    /// The route of the path alone ([`api::route`]), whatever the model:
    /// its error shape, and whether it was `POST /`.
    pub path_route: Route,
    /// Whether the path named the model (`/models/{name}/...`).
    pub prefixed: bool,
}

/// The models' names and kinds, in the order given.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    models: Vec<(String, ModelKind)>,
}

impl Catalog {
    pub fn new(models: Vec<(String, ModelKind)>) -> Catalog {
        Catalog { models }
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    pub fn names(&self) -> Vec<&str> {
        self.models.iter().map(|(n, _)| n.as_str()).collect()
    }

    fn find(&self, name: &[u8]) -> Option<usize> {
        self.models.iter().position(|(n, _)| n.as_bytes() == name)
    }

    /// The model and route of a request line; `body_model` gives the
    /// body's `model` when the route picks by it (it is read only then).
    /// `Err` is the reply to a request that names no served model, or one
    /// of the wrong kind.
    pub fn choose(
        &self,
        method: &[u8],
        target: &[u8],
        body_model: impl FnOnce() -> Option<String>,
    ) -> Result<Choice, ApiError> {
        if let Some((model, rest)) = self.prefixed(target)? {
            return Ok(Choice {
                model,
                route: api::resolve(method, rest, self.models[model].1),
                path_route: api::route(method, rest),
                prefixed: true,
            });
        }
        let entry = match api::lookup(method, target) {
            Ok(e) => e,
            Err(route) => {
                return Ok(Choice {
                    model: 0,
                    route,
                    path_route: route,
                    prefixed: false,
                });
            }
        };
        let answers = |i: &usize| entry.serves.contains(&self.models[*i].1);
        let first = (0..self.len()).find(answers).unwrap_or(0);
        let by_body = matches!(
            entry.route,
            Route::OpenAiEmbeddings | Route::CohereRerank(_)
        );
        let model = match by_body && self.len() > 1 {
            false => first,
            true => match body_model() {
                None => first,
                Some(name) => {
                    let flavor = entry.route.flavor();
                    let Some(i) = self.find(name.as_bytes()) else {
                        return Err(ApiError::unknown_model(flavor, &name, &self.names()));
                    };
                    if !answers(&i) {
                        let answering: Vec<&str> = (0..self.len())
                            .filter(answers)
                            .map(|i| self.models[i].0.as_str())
                            .collect();
                        return Err(ApiError::model_of_wrong_kind(
                            flavor,
                            &name,
                            self.models[i].1.name(),
                            entry.needs,
                            &answering,
                        ));
                    }
                    i
                }
            },
        };
        Ok(Choice {
            model,
            route: api::resolve(method, target, self.models[model].1),
            path_route: entry.route,
            prefixed: false,
        })
    }

    /// The served models that answer `route` (a path's own route), by
    /// name, in order.
    pub fn answering(&self, route: Route) -> Vec<&str> {
        let Some(entry) = api::ROUTES.iter().find(|e| e.route == route) else {
            return Vec::new();
        };
        self.models
            .iter()
            .filter(|(_, k)| entry.serves.contains(k))
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// `/models/{name}/rest`: the model and `rest` (`/` for the name's
    /// path itself, where huggingface_hub posts); `None` for another path.
    fn prefixed<'t>(&self, target: &'t [u8]) -> Result<Option<(usize, &'t [u8])>, ApiError> {
        let Some(tail) = target.strip_prefix(b"/models/") else {
            return Ok(None);
        };
        // A name may hold `/` (`sentence-transformers/all-MiniLM-L6-v2`):
        // the longest served name the path goes on from wins.
        let found = self
            .models
            .iter()
            .enumerate()
            .filter(|(_, (n, _))| {
                tail.strip_prefix(n.as_bytes())
                    .is_some_and(|r| r.is_empty() || r[0] == b'/' || r[0] == b'?')
            })
            .max_by_key(|(_, (n, _))| n.len());
        match found {
            Some((i, (n, _))) => {
                let rest = &tail[n.len()..];
                Ok(Some((i, if rest.is_empty() { b"/" } else { rest })))
            }
            None => {
                let end = tail.iter().position(|&b| b == b'/' || b == b'?');
                let name = String::from_utf8_lossy(&tail[..end.unwrap_or(tail.len())]);
                Err(ApiError::unknown_model(
                    api::Flavor::Tei,
                    &name,
                    &self.names(),
                ))
            }
        }
    }

    /// `GET /v1/models`: OpenAI's list object. `created` is when the
    /// server started (OpenAI's is when the model was made: not known).
    pub fn write_list(&self, created: u64, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
        for (i, (name, _)) in self.models.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"id\":");
            api::write_json_str(name, out);
            out.extend_from_slice(b",\"object\":\"model\",\"created\":");
            out.extend_from_slice(created.to_string().as_bytes());
            out.extend_from_slice(b",\"owned_by\":\"m0serve\"}");
        }
        out.extend_from_slice(b"]}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CohereVersion, Flavor};
    use ModelKind::{Embedding, Reranker};

    fn three() -> Catalog {
        Catalog::new(vec![
            ("mini".into(), Embedding),
            ("org/mini2".into(), Embedding),
            ("rr".into(), Reranker),
        ])
    }

    fn pick(c: &Catalog, method: &[u8], path: &[u8], model: Option<&str>) -> (usize, Route) {
        let ch = c
            .choose(method, path, || model.map(str::to_string))
            .unwrap();
        (ch.model, ch.route)
    }

    #[test]
    fn args_name_a_model_or_not() {
        assert_eq!(
            ModelArg::parse("bge=/m/bge"),
            ModelArg {
                name: Some("bge".into()),
                dir: "/m/bge".into()
            }
        );
        assert_eq!(ModelArg::parse("/m/a=b").name, None);
        assert_eq!(ModelArg::parse("=x").name, None);
        assert_eq!(ModelArg::parse("").dir, "");
        assert!(check_name("bge-small").is_ok());
        assert!(check_name("org/name").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name("a\"b").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
    }

    #[test]
    fn the_path_prefix_picks_the_model() {
        let c = three();
        assert_eq!(
            pick(&c, b"POST", b"/models/rr/rerank", None),
            (2, Route::Rerank)
        );
        assert_eq!(pick(&c, b"POST", b"/models/rr", None), (2, Route::Rerank));
        assert_eq!(pick(&c, b"POST", b"/models/rr/", None), (2, Route::Rerank));
        assert_eq!(
            pick(&c, b"POST", b"/models/org/mini2/embed", None),
            (1, Route::Embed)
        );
        assert_eq!(
            pick(&c, b"GET", b"/models/mini/info?x", None),
            (0, Route::Info)
        );
        // The prefix wins over the body's model.
        assert_eq!(
            pick(&c, b"POST", b"/models/mini/v1/embeddings", Some("rr")),
            (0, Route::OpenAiEmbeddings)
        );
        assert!(matches!(
            pick(&c, b"POST", b"/models/mini/rerank", None),
            (0, Route::WrongModel { .. })
        ));
        let e = c
            .choose(b"POST", b"/models/nope/embed", || None)
            .unwrap_err();
        assert_eq!((e.status, e.flavor), (404, Flavor::Tei));
        assert!(e.message.contains("mini, org/mini2, rr"), "{}", e.message);
        // `/models/minix/...` is no prefix of `mini`.
        assert!(c.choose(b"POST", b"/models/minix/embed", || None).is_err());
    }

    #[test]
    fn openai_and_cohere_pick_by_the_body() {
        let c = three();
        let v2 = Route::CohereRerank(CohereVersion::V2);
        assert_eq!(
            pick(&c, b"POST", b"/v1/embeddings", Some("org/mini2")),
            (1, Route::OpenAiEmbeddings)
        );
        assert_eq!(pick(&c, b"POST", b"/v1/embeddings", None).0, 0);
        assert_eq!(pick(&c, b"POST", b"/v2/rerank", Some("rr")), (2, v2));
        assert_eq!(pick(&c, b"POST", b"/v2/rerank", None), (2, v2));
        let e = c
            .choose(b"POST", b"/v1/embeddings", || Some("gpt".into()))
            .unwrap_err();
        assert_eq!(
            (e.status, e.code, e.param),
            (404, Some("model_not_found"), Some("model"))
        );
        assert_eq!(e.flavor, Flavor::OpenAi);
        let e = c
            .choose(b"POST", b"/v1/rerank", || Some("x".into()))
            .unwrap_err();
        assert_eq!((e.status, e.flavor), (404, Flavor::Cohere));
        let e = c
            .choose(b"POST", b"/v1/rerank", || Some("mini".into()))
            .unwrap_err();
        assert_eq!((e.status, e.flavor), (400, Flavor::Cohere));
        assert!(
            e.message.contains("`mini` is an embedding model"),
            "{}",
            e.message
        );
        assert!(e.message.contains("rr"), "{}", e.message);
        let e = c
            .choose(b"POST", b"/v1/embeddings", || Some("rr".into()))
            .unwrap_err();
        assert_eq!((e.status, e.flavor), (400, Flavor::OpenAi));
    }

    #[test]
    fn one_model_takes_any_name_and_tei_routes_take_the_first_of_their_kind() {
        let one = Catalog::new(vec![("mini".into(), Embedding)]);
        let read = || -> Option<String> { panic!("one model reads no body") };
        let ch = one.choose(b"POST", b"/v1/embeddings", read).unwrap();
        assert_eq!((ch.model, ch.route), (0, Route::OpenAiEmbeddings));
        assert!(!ch.prefixed);
        let c = three();
        assert_eq!(pick(&c, b"POST", b"/rerank", None), (2, Route::Rerank));
        assert_eq!(pick(&c, b"POST", b"/embed", None), (0, Route::Embed));
        assert_eq!(pick(&c, b"POST", b"/", None), (0, Route::Embed));
        assert_eq!(pick(&c, b"GET", b"/info", None), (0, Route::Info));
        assert_eq!(pick(&c, b"GET", b"/v1/models", None), (0, Route::Models));
        assert_eq!(pick(&c, b"GET", b"/nope", None), (0, Route::NotFound));
        assert_eq!(c.answering(Route::Rerank), ["rr"]);
        assert_eq!(c.answering(Route::Embed), ["mini", "org/mini2"]);
        assert!(c.answering(Route::EmbedSparse).is_empty());
        // No model answers it: the first, whose kind answers 424.
        assert!(matches!(
            pick(&c, b"POST", b"/embed_sparse", None),
            (0, Route::WrongModel { .. })
        ));
    }

    #[test]
    fn the_list_is_openais() {
        let mut out = Vec::new();
        three().write_list(7, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["object"], "list");
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["mini", "org/mini2", "rr"]);
        assert_eq!(v["data"][2]["object"], "model");
        assert_eq!(v["data"][2]["created"], 7);
    }
}
