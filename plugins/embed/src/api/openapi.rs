//! `GET /openapi.json`: the OpenAPI 3.1 document of this API.
//!
//! The document is `openapi.json` beside this file, written by hand next to
//! the code it describes and checked in as the server serves it with the
//! default limits and token ids accepted. A server started with other
//! limits serves its own: the numbers a request is checked against
//! ([`Limits`]) and the version are filled in at [`LIMITS`]' places, and
//! the token-id forms of `inputs` and `input` are left out unless the
//! server accepts them ([`Limits::accept_token_ids`]): a document that
//! offered them would promise what the server refuses with 422. The unit tests below hold the document
//! to [`super::ROUTES`] and to every error this module's API can answer,
//! and `tests/openapi.rs` validates it and fuzzes a running server with it.

use serde_json::Value;

use super::request::Limits;
use super::route::{ModelKind, ROUTES};

/// The document as checked in: the default [`Limits`] but with token ids
/// accepted, this crate's version.
pub(crate) const DOCUMENT: &str = include_str!("openapi.json");

/// Reads one configured number from [`Limits`].
type Limit = fn(&Limits) -> usize;

/// Where each configured number goes in the document (a JSON pointer), and
/// which one.
const LIMITS: &[(&str, Limit)] = &[
    ("/components/schemas/TeiInputs/oneOf/1/maxItems", |l| {
        l.max_client_batch_size
    }),
    ("/components/schemas/TeiInputs/oneOf/3/maxItems", |l| {
        l.max_client_batch_size
    }),
    ("/components/schemas/OpenAiInputs/oneOf/1/maxItems", |l| {
        l.max_openai_inputs
    }),
    ("/components/schemas/OpenAiInputs/oneOf/3/maxItems", |l| {
        l.max_openai_inputs
    }),
    ("/components/schemas/TokenId/maximum", |l| {
        l.vocab.saturating_sub(1)
    }),
    (
        "/components/schemas/OpenAiRequest/properties/dimensions/maximum",
        |l| l.dim,
    ),
    (
        "/components/schemas/TeiRequest/properties/dimensions/maximum",
        |l| l.dim,
    ),
    (
        "/components/schemas/TokenizeRequest/properties/inputs/oneOf/1/maxItems",
        |l| l.max_client_batch_size,
    ),
    (
        "/components/schemas/DecodeRequest/properties/ids/oneOf/1/maxItems",
        |l| l.max_client_batch_size,
    ),
    ("/components/schemas/DecodeId/maximum", |l| {
        l.vocab.saturating_sub(1)
    }),
    (
        "/components/schemas/RerankRequest/properties/texts/maxItems",
        |l| l.max_client_batch_size,
    ),
    (
        "/components/schemas/PredictRequest/properties/inputs/oneOf/2/maxItems",
        |l| l.max_client_batch_size,
    ),
    (
        "/components/schemas/SimilarityRequest/properties/inputs/properties/sentences/maxItems",
        |l| l.max_client_batch_size,
    ),
    (
        "/components/schemas/CohereRerankRequest/properties/documents/maxItems",
        |l| l.max_cohere_documents,
    ),
];

/// Where the token-id forms are in `oneOf` of `TeiInputs` and
/// `OpenAiInputs`: after a text and a list of texts, a sequence of ids and
/// a list of sequences.
const ID_FORMS: std::ops::Range<usize> = 2..4;

/// The OpenAPI document for a server with `limits`, as `version`: JSON
/// bytes, of the routes a model of `kind` answers (all of them for
/// `None`, as checked in). An error only if the checked-in document were
/// not JSON or lacked one of the places a limit goes, which the unit tests
/// rule out.
pub fn openapi_document(
    limits: &Limits,
    version: &str,
    kind: Option<ModelKind>,
) -> Result<Vec<u8>, String> {
    let mut doc: Value = serde_json::from_str(DOCUMENT)
        .map_err(|e| format!("the built-in OpenAPI document is not JSON: {e}"))?;
    // A route the model cannot answer is a 424 whatever is sent: listed,
    // it would promise what the server refuses.
    if let (Some(kind), Some(paths)) = (
        kind,
        doc.pointer_mut("/paths").and_then(Value::as_object_mut),
    ) {
        paths.retain(|path, _| {
            ROUTES
                .iter()
                .any(|e| e.path == path && e.serves.contains(&kind))
        });
    }
    for (pointer, value) in LIMITS {
        let slot = doc
            .pointer_mut(pointer)
            .ok_or_else(|| format!("the built-in OpenAPI document has no {pointer}"))?;
        *slot = Value::from(value(limits));
    }
    // `prompt_name` takes the model's prompts' names, or null.
    for schema in ["TeiRequest", "EmbedAllRequest", "TokenizeRequest"] {
        let pointer = format!("/components/schemas/{schema}/properties/prompt_name/enum");
        let slot = doc
            .pointer_mut(&pointer)
            .ok_or_else(|| format!("the built-in OpenAPI document has no {pointer}"))?;
        let mut names: Vec<Value> = limits
            .prompt_names
            .iter()
            .map(|n| n.as_str().into())
            .collect();
        names.push(Value::Null);
        *slot = Value::Array(names);
    }
    if !limits.accept_token_ids {
        for schema in ["TeiInputs", "OpenAiInputs"] {
            let forms = doc
                .pointer_mut(&format!("/components/schemas/{schema}/oneOf"))
                .and_then(Value::as_array_mut)
                .filter(|forms| forms.len() == ID_FORMS.end)
                .ok_or_else(|| {
                    format!("the built-in OpenAPI document's {schema} is not 4 forms")
                })?;
            forms.drain(ID_FORMS);
        }
        if let Some(schemas) = doc
            .pointer_mut("/components/schemas")
            .and_then(Value::as_object_mut)
        {
            schemas.remove("TokenId");
        }
    }
    let slot = doc
        .pointer_mut("/info/version")
        .ok_or("the built-in OpenAPI document has no /info/version")?;
    *slot = Value::from(version);
    serde_json::to_vec(&doc).map_err(|e| format!("writing the OpenAPI document: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::error::{ApiError, Flavor};
    use super::super::route::{Route, RouteEntry, route};
    use super::*;
    use std::collections::BTreeSet;

    fn doc(limits: &Limits) -> Value {
        serde_json::from_slice(&openapi_document(limits, env!("CARGO_PKG_VERSION"), None).unwrap())
            .unwrap()
    }

    /// `$ref`s followed to what they name.
    fn resolve<'a>(root: &'a Value, v: &'a Value) -> &'a Value {
        match v.get("$ref").and_then(Value::as_str) {
            Some(r) => resolve(root, root.pointer(&r[1..]).unwrap_or_else(|| panic!("{r}"))),
            None => v,
        }
    }

    fn ids_ok() -> Limits {
        Limits {
            accept_token_ids: true,
            ..Limits::default()
        }
    }

    #[test]
    fn the_checked_in_document_is_what_the_default_limits_give() {
        let checked_in: Value = serde_json::from_str(DOCUMENT).unwrap();
        assert_eq!(
            doc(&ids_ok()),
            checked_in,
            "update openapi.json: it holds the default limits, token ids accepted and this \
             crate's version"
        );
        assert_eq!(checked_in["openapi"], "3.1.0");
    }

    #[test]
    fn token_id_forms_are_documented_only_where_accepted() {
        let forms = |d: &Value, schema: &str| -> Vec<Value> {
            d["components"]["schemas"][schema]["oneOf"]
                .as_array()
                .unwrap()
                .clone()
        };
        let with = doc(&ids_ok());
        let without = doc(&Limits::default());
        for schema in ["TeiInputs", "OpenAiInputs"] {
            let all = forms(&with, schema);
            assert_eq!(all.len(), 4);
            assert_eq!(forms(&without, schema), all[..2].to_vec(), "{schema}");
            assert!(all[..2].iter().all(|f| !f.to_string().contains("TokenId")));
            assert!(all[2..].iter().all(|f| f.to_string().contains("TokenId")));
        }
        assert!(with["components"]["schemas"]["TokenId"].is_object());
        assert!(!without.to_string().contains("TokenId"));
    }

    #[test]
    fn limits_are_filled_in() {
        let l = Limits {
            accept_token_ids: true,
            max_client_batch_size: 7,
            max_openai_inputs: 9,
            vocab: 100,
            dim: 16,
            ..Limits::default()
        };
        let d = doc(&l);
        let s = &d["components"]["schemas"];
        assert_eq!(s["TeiInputs"]["oneOf"][1]["maxItems"], 7);
        assert_eq!(s["TeiInputs"]["oneOf"][3]["maxItems"], 7);
        assert_eq!(s["OpenAiInputs"]["oneOf"][1]["maxItems"], 9);
        assert_eq!(s["OpenAiInputs"]["oneOf"][3]["maxItems"], 9);
        assert_eq!(s["TokenId"]["maximum"], 99);
        assert_eq!(
            s["OpenAiRequest"]["properties"]["dimensions"]["maximum"],
            16
        );
        let d: Value =
            serde_json::from_slice(&openapi_document(&l, "9.9.9", None).unwrap()).unwrap();
        assert_eq!(d["info"]["version"], "9.9.9");
        let l = Limits {
            prompt_names: vec!["query".into()],
            ..Limits::default()
        };
        let d = doc(&l);
        assert_eq!(
            d["components"]["schemas"]["TokenizeRequest"]["properties"]["prompt_name"]["enum"],
            serde_json::json!(["query", null])
        );
    }

    #[test]
    fn every_route_is_documented_with_its_methods_and_nothing_else() {
        let d = doc(&Limits::default());
        let paths = d["paths"].as_object().unwrap();
        let documented: BTreeSet<&str> = paths.keys().map(String::as_str).collect();
        let routed: BTreeSet<&str> = ROUTES.iter().map(|e| e.path).collect();
        assert_eq!(documented, routed);
        for &RouteEntry {
            path,
            route: target,
            methods: allow,
            ..
        } in ROUTES
        {
            let methods: BTreeSet<String> = paths[path]
                .as_object()
                .unwrap()
                .keys()
                .map(|m| m.to_ascii_uppercase())
                .collect();
            let allowed: BTreeSet<String> = allow.split(", ").map(str::to_string).collect();
            assert_eq!(methods, allowed, "{path}");
            for m in &methods {
                assert_eq!(route(m.as_bytes(), path.as_bytes()), target, "{m} {path}");
            }
        }
    }

    /// Every error an embedding route answers, with the routes it comes
    /// back on: each must be a documented status of each of them, its
    /// `error_type` (TEI) or `type` and `code` (OpenAI) among those the
    /// document allows for that status.
    #[test]
    fn every_error_the_embedding_routes_answer_is_documented() {
        let d = doc(&Limits::default());
        let errors = |f: Flavor| {
            let mut all = vec![
                ApiError::malformed(f, "x"),
                ApiError::invalid(f, "inputs", "x".into()),
                ApiError::empty_input(f),
                ApiError::too_many(f, 40, 32),
                ApiError::token_ids(f),
                ApiError::token_id_out_of_vocabulary(f, 0, 0, "-1", 30522),
                ApiError::too_long(f, 0, 300, 256),
                ApiError::payload_too_large(f, 3, 2),
                ApiError::tokenizer(f, "x"),
                ApiError::backend(f, "x"),
                ApiError::internal(f, "x"),
                ApiError::overloaded(f, "x"),
            ];
            // With several models: a `model` not served, or of another
            // kind.
            if f == Flavor::OpenAi {
                all.push(ApiError::unknown_model(f, "x", &["a", "b"]));
                all.push(ApiError::model_of_wrong_kind(
                    f,
                    "b",
                    "reranker",
                    "an embedding",
                    &["a"],
                ));
            }
            // TEI's fields alone: a prompt, text pairs.
            if f == Flavor::Tei {
                all.push(ApiError::unknown_prompt(f, "x", &["query"]));
                all.push(ApiError::invalid(f, "inputs", "x".into()).with_code("pairs_unsupported"));
            }
            all
        };
        let allowed = |schema: &Value, key: &str| -> Vec<Value> {
            // The status's schema narrows the shared one with an enum or a
            // const under `properties` (for OpenAI, under `error`).
            let s = resolve(&d, schema);
            let p = match key {
                "error_type" => &s["properties"]["error_type"],
                k => &s["properties"]["error"]["properties"][k],
            };
            match (p.get("enum"), p.get("const")) {
                (Some(Value::Array(e)), _) => e.clone(),
                (_, Some(c)) => vec![c.clone()],
                _ => panic!("no enum or const for {key} in {s}"),
            }
        };
        for (flavor, paths) in [
            (Flavor::Tei, ["/embed", "/"]),
            (Flavor::OpenAi, ["/v1/embeddings", "/embeddings"]),
        ] {
            for path in paths {
                let responses = &d["paths"][path]["post"]["responses"];
                for e in errors(flavor) {
                    let r = resolve(&d, &responses[e.status.to_string()]);
                    let schema = &r["content"]["application/json"]["schema"];
                    assert!(schema.is_object(), "{path}: {} not documented", e.status);
                    match flavor {
                        Flavor::Tei => assert!(
                            allowed(schema, "error_type").contains(&e.kind.into()),
                            "{path} {e}"
                        ),
                        Flavor::OpenAi | Flavor::Cohere => {
                            assert!(allowed(schema, "type").contains(&e.kind.into()), "{e}");
                            let code = e.code.map(Value::from).unwrap_or(Value::Null);
                            assert!(allowed(schema, "code").contains(&code), "{path} {e}");
                        }
                    }
                }
            }
        }
        // And the document lists no status the routes never answer: 200,
        // the statuses above, the server's 401 (API keys) and 503 (busy).
        let mut want: BTreeSet<u16> = [200, 401, 503].into();
        for f in [Flavor::Tei, Flavor::OpenAi] {
            want.extend(errors(f).iter().map(|e| e.status));
        }
        let mut listed = BTreeSet::new();
        for path in ["/embed", "/", "/v1/embeddings", "/embeddings"] {
            for k in d["paths"][path]["post"]["responses"]
                .as_object()
                .unwrap()
                .keys()
            {
                listed.insert(k.parse::<u16>().unwrap());
            }
        }
        assert_eq!(listed, want);
    }

    #[test]
    fn not_found_names_the_document() {
        assert!(
            ApiError::not_found(b"GET", b"/docs")
                .message
                .contains("GET /openapi.json")
        );
        assert_eq!(route(b"GET", b"/openapi.json"), Route::OpenApi);
    }

    #[test]
    fn a_server_lists_the_routes_its_model_answers() {
        let paths = |kind| -> BTreeSet<String> {
            let d: Value = serde_json::from_slice(
                &openapi_document(&Limits::default(), "0", Some(kind)).unwrap(),
            )
            .unwrap();
            d["paths"].as_object().unwrap().keys().cloned().collect()
        };
        let embedder = paths(ModelKind::Embedding);
        assert!(embedder.contains("/embed") && embedder.contains("/similarity"));
        assert!(!embedder.contains("/rerank") && !embedder.contains("/v2/rerank"));
        let reranker = paths(ModelKind::Reranker);
        for p in [
            "/",
            "/rerank",
            "/predict",
            "/v1/rerank",
            "/v2/rerank",
            "/info",
        ] {
            assert!(reranker.contains(p), "{p}");
        }
        assert!(!reranker.contains("/embed"));
        let sparse = paths(ModelKind::Sparse);
        assert!(sparse.contains("/embed_sparse") && !sparse.contains("/predict"));
        // A limit reaches the new routes' lists too.
        let l = Limits {
            max_client_batch_size: 5,
            max_cohere_documents: 6,
            ..Limits::default()
        };
        let d = doc(&l);
        let s = &d["components"]["schemas"];
        assert_eq!(s["RerankRequest"]["properties"]["texts"]["maxItems"], 5);
        assert_eq!(
            s["CohereRerankRequest"]["properties"]["documents"]["maxItems"],
            6
        );
    }
}
