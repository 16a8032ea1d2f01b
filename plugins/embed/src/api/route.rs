//! Which handler a request line goes to, decided once, here, from
//! [`ROUTES`]: each path, the route it is, its methods, and the kinds of
//! model that answer it. [`route`] reads the request line alone (the
//! OpenAPI document and the tests use it); [`resolve`] adds the model's
//! kind: `POST /` becomes the kind's own route, and a route the model
//! cannot answer becomes [`Route::WrongModel`] (TEI's 424).

/// What the served model is, as the routes see it: TEI's model types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Sentence embeddings (TEI's `embedding`).
    Embedding,
    /// A cross-encoder of one label (TEI's `reranker`).
    Reranker,
    /// A cross-encoder of several labels (TEI's `classifier`).
    Classifier,
    /// SPLADE sparse vectors (TEI serves them as an `embedding` model with
    /// `splade` pooling).
    Sparse,
}

impl ModelKind {
    /// What `POST /` is for this kind, as in TEI: each kind's main route.
    fn root(self) -> Route {
        match self {
            ModelKind::Embedding => Route::Embed,
            ModelKind::Reranker => Route::Rerank,
            ModelKind::Classifier => Route::Predict,
            ModelKind::Sparse => Route::EmbedSparse,
        }
    }

    /// Its name in messages, `--doctor`'s `embed.task` and `/info`'s
    /// `task`: `embedding`, `reranker`, `classifier` or `sparse`.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Embedding => "embedding",
            ModelKind::Reranker => "reranker",
            ModelKind::Classifier => "classifier",
            ModelKind::Sparse => "sparse",
        }
    }
}

/// Which version of Cohere's rerank API a request came in on (they differ
/// in the `meta.api_version` they answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CohereVersion {
    V1,
    V2,
}

/// Where a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /embed` (and `POST /` for an embedding model, where
    /// huggingface_hub's `InferenceClient.feature_extraction` posts):
    /// parse with [`super::parse_tei`], answer with [`super::write_tei`].
    Embed,
    /// `POST /v1/embeddings` (also `POST /embeddings`, which TEI serves
    /// too): parse with [`super::parse_openai`], answer with
    /// [`super::write_openai`].
    OpenAiEmbeddings,
    /// `POST /embed_all`: every token's vector, [`super::parse_embed_all`].
    EmbedAll,
    /// `POST /embed_sparse`: SPLADE vectors, parsed as `/embed_all` is,
    /// answered with [`super::write_sparse`].
    EmbedSparse,
    /// `POST /similarity`: cosines of embeddings,
    /// [`super::parse_similarity`].
    Similarity,
    /// `POST /rerank`: scores of (query, text) pairs,
    /// [`super::parse_rerank`].
    Rerank,
    /// `POST /predict`: labels of texts or pairs, [`super::parse_predict`].
    Predict,
    /// `POST /v1/rerank`, `POST /v2/rerank`: Cohere's rerank,
    /// [`super::parse_cohere`].
    CohereRerank(CohereVersion),
    /// `POST /tokenize`: [`super::parse_tokenize`].
    Tokenize,
    /// `POST /decode`: [`super::parse_decode`].
    Decode,
    /// `GET /health` (or `HEAD`): 200 with an empty body once the model is
    /// loaded, else [`super::ApiError::unavailable`].
    Health,
    /// `GET /info` (or `HEAD`): [`super::write_info`].
    Info,
    /// `GET /openapi.json` (or `HEAD`): the OpenAPI document of these
    /// routes, [`super::openapi_document`].
    OpenApi,
    /// `GET /v1/models` (or `HEAD`): OpenAI's list of the served models.
    Models,
    /// `POST /`: the model's kind's own route ([`resolve`] decides).
    Root,
    /// No such path: answer [`super::ApiError::not_found`].
    NotFound,
    /// A known path with the wrong method: answer
    /// [`super::ApiError::method_not_allowed`], with an `Allow: {allow}`
    /// header.
    MethodNotAllowed {
        /// The `Allow` header value.
        allow: &'static str,
    },
    /// A route this model's kind cannot answer: answer
    /// [`super::ApiError::wrong_model`] (424), naming what it needs.
    WrongModel {
        /// What the route needs, for the message: "a re-ranker".
        needs: &'static str,
    },
}

impl Route {
    /// The error shape of its replies: Cohere's on Cohere's paths,
    /// OpenAI's on OpenAI's, TEI's elsewhere.
    pub fn flavor(self) -> super::Flavor {
        match self {
            Route::OpenAiEmbeddings | Route::Models => super::Flavor::OpenAi,
            Route::CohereRerank(_) => super::Flavor::Cohere,
            _ => super::Flavor::Tei,
        }
    }
}

const POST: &str = "POST";
const GET: &str = "GET, HEAD";

use ModelKind::{Classifier, Embedding, Reranker, Sparse};
const ALL: &[ModelKind] = &[Embedding, Reranker, Classifier, Sparse];
const EMBEDDING: &[ModelKind] = &[Embedding];
const RERANKER: &[ModelKind] = &[Reranker];
// TEI's /predict takes a reranker too (its one label, `LABEL_0` or its
// own name, scored with a sigmoid).
const CROSS_ENCODERS: &[ModelKind] = &[Reranker, Classifier];
const SPARSE: &[ModelKind] = &[Sparse];

/// One row of [`ROUTES`].
#[derive(Clone, Copy, Debug)]
pub struct RouteEntry {
    pub path: &'static str,
    pub route: Route,
    /// The methods it takes (the `Allow` value of a 405).
    pub methods: &'static str,
    /// The kinds of model that answer it; any other is a 424.
    pub serves: &'static [ModelKind],
    /// What it needs, in the 424's message ("model is not {needs} model").
    pub needs: &'static str,
}

const fn entry(
    path: &'static str,
    route: Route,
    methods: &'static str,
    serves: &'static [ModelKind],
    needs: &'static str,
) -> RouteEntry {
    RouteEntry {
        path,
        route,
        methods,
        serves,
        needs,
    }
}

const AN_EMBEDDING: &str = "an embedding";

/// Every path this API answers, where it goes, the methods it takes and
/// the models that answer it. The OpenAPI document lists the same paths
/// and methods; a unit test of `openapi` holds the two equal.
pub const ROUTES: &[RouteEntry] = &[
    entry("/embed", Route::Embed, POST, EMBEDDING, AN_EMBEDDING),
    entry("/", Route::Root, POST, ALL, ""),
    entry(
        "/v1/embeddings",
        Route::OpenAiEmbeddings,
        POST,
        EMBEDDING,
        AN_EMBEDDING,
    ),
    entry(
        "/embeddings",
        Route::OpenAiEmbeddings,
        POST,
        EMBEDDING,
        AN_EMBEDDING,
    ),
    entry("/embed_all", Route::EmbedAll, POST, EMBEDDING, AN_EMBEDDING),
    entry(
        "/embed_sparse",
        Route::EmbedSparse,
        POST,
        SPARSE,
        "a sparse (SPLADE)",
    ),
    entry(
        "/similarity",
        Route::Similarity,
        POST,
        EMBEDDING,
        AN_EMBEDDING,
    ),
    entry("/rerank", Route::Rerank, POST, RERANKER, "a re-ranker"),
    entry(
        "/predict",
        Route::Predict,
        POST,
        CROSS_ENCODERS,
        "a classifier",
    ),
    entry(
        "/v1/rerank",
        Route::CohereRerank(CohereVersion::V1),
        POST,
        RERANKER,
        "a re-ranker",
    ),
    entry(
        "/v2/rerank",
        Route::CohereRerank(CohereVersion::V2),
        POST,
        RERANKER,
        "a re-ranker",
    ),
    entry("/tokenize", Route::Tokenize, POST, ALL, ""),
    entry("/decode", Route::Decode, POST, ALL, ""),
    entry("/health", Route::Health, GET, ALL, ""),
    entry("/info", Route::Info, GET, ALL, ""),
    entry("/openapi.json", Route::OpenApi, GET, ALL, ""),
    entry("/v1/models", Route::Models, GET, ALL, ""),
];

/// The table's row for a request line, or the route that answers its
/// mistake (404, 405). `path` is the request target; a query string
/// (`?...`) is ignored. Methods are case-sensitive, as HTTP says.
pub(crate) fn lookup(method: &[u8], path: &[u8]) -> Result<&'static RouteEntry, Route> {
    let path = match path.iter().position(|&b| b == b'?') {
        Some(q) => &path[..q],
        None => path,
    };
    let Some(e) = ROUTES.iter().find(|e| e.path.as_bytes() == path) else {
        return Err(Route::NotFound);
    };
    let ok = match e.methods {
        POST => method == b"POST",
        _ => method == b"GET" || method == b"HEAD",
    };
    if ok {
        Ok(e)
    } else {
        Err(Route::MethodNotAllowed { allow: e.methods })
    }
}

/// Routes a request line, whatever the model (`POST /` is
/// [`Route::Root`]).
pub fn route(method: &[u8], path: &[u8]) -> Route {
    lookup(method, path).map_or_else(|r| r, |e| e.route)
}

/// Routes a request for a model of `kind`: `POST /` is the kind's route,
/// and a route the kind does not answer is [`Route::WrongModel`].
pub fn resolve(method: &[u8], path: &[u8], kind: ModelKind) -> Route {
    match lookup(method, path) {
        Err(r) => r,
        Ok(e) if !e.serves.contains(&kind) => Route::WrongModel { needs: e.needs },
        Ok(e) if e.route == Route::Root => kind.root(),
        Ok(e) => e.route,
    }
}

/// The routes a model of `kind` answers, for messages: "POST /embed,
/// POST /, ..., GET /openapi.json".
pub fn served_by(kind: ModelKind) -> String {
    ROUTES
        .iter()
        .filter(|e| e.serves.contains(&kind))
        .map(|e| {
            format!(
                "{} {}",
                e.methods.split(", ").next().unwrap_or(POST),
                e.path
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_routes() {
        assert_eq!(route(b"POST", b"/embed"), Route::Embed);
        assert_eq!(route(b"POST", b"/"), Route::Root);
        assert_eq!(route(b"POST", b"/rerank"), Route::Rerank);
        assert_eq!(route(b"POST", b"/predict"), Route::Predict);
        assert_eq!(route(b"POST", b"/embed_sparse"), Route::EmbedSparse);
        assert_eq!(route(b"POST", b"/similarity"), Route::Similarity);
        assert_eq!(
            route(b"POST", b"/v1/rerank"),
            Route::CohereRerank(CohereVersion::V1)
        );
        assert_eq!(
            route(b"POST", b"/v2/rerank"),
            Route::CohereRerank(CohereVersion::V2)
        );
        assert_eq!(route(b"POST", b"/v1/embeddings"), Route::OpenAiEmbeddings);
        assert_eq!(route(b"POST", b"/embeddings"), Route::OpenAiEmbeddings);
        assert_eq!(route(b"POST", b"/embed_all"), Route::EmbedAll);
        assert_eq!(route(b"POST", b"/tokenize"), Route::Tokenize);
        assert_eq!(route(b"POST", b"/decode"), Route::Decode);
        assert_eq!(route(b"GET", b"/health"), Route::Health);
        assert_eq!(route(b"HEAD", b"/health"), Route::Health);
        assert_eq!(route(b"GET", b"/info"), Route::Info);
        assert_eq!(route(b"GET", b"/openapi.json"), Route::OpenApi);
        assert_eq!(route(b"HEAD", b"/openapi.json?x"), Route::OpenApi);
        assert_eq!(route(b"GET", b"/v1/models"), Route::Models);
    }

    #[test]
    fn query_strings_are_ignored() {
        assert_eq!(route(b"POST", b"/embed?x=1"), Route::Embed);
        assert_eq!(route(b"GET", b"/info?"), Route::Info);
        assert_eq!(route(b"POST", b"/?wait_for_model=true"), Route::Root);
    }

    #[test]
    fn wrong_method_gives_405_with_allow() {
        assert_eq!(
            route(b"GET", b"/embed"),
            Route::MethodNotAllowed { allow: "POST" }
        );
        assert_eq!(
            route(b"GET", b"/v1/embeddings"),
            Route::MethodNotAllowed { allow: "POST" }
        );
        assert_eq!(
            route(b"POST", b"/health"),
            Route::MethodNotAllowed { allow: "GET, HEAD" }
        );
        assert_eq!(
            route(b"DELETE", b"/info"),
            Route::MethodNotAllowed { allow: "GET, HEAD" }
        );
        assert_eq!(
            route(b"post", b"/embed"),
            Route::MethodNotAllowed { allow: "POST" }
        );
    }

    #[test]
    fn unknown_paths_are_404() {
        for p in [
            &b"/embed/"[..],
            b"/v1/chat/completions",
            b"/Embed",
            b"",
            b"/embed_all/",
            b"\xff",
        ] {
            assert_eq!(route(b"POST", p), Route::NotFound, "{p:?}");
        }
    }

    #[test]
    fn the_root_is_each_kinds_own_route() {
        for (kind, want) in [
            (Embedding, Route::Embed),
            (Reranker, Route::Rerank),
            (Classifier, Route::Predict),
            (Sparse, Route::EmbedSparse),
        ] {
            assert_eq!(resolve(b"POST", b"/", kind), want, "{kind:?}");
        }
    }

    #[test]
    fn a_route_the_model_cannot_answer_is_a_wrong_model() {
        let wrong = |p: &[u8], k| resolve(b"POST", p, k);
        assert_eq!(
            wrong(b"/rerank", Embedding),
            Route::WrongModel {
                needs: "a re-ranker"
            }
        );
        assert_eq!(
            wrong(b"/embed", Reranker),
            Route::WrongModel {
                needs: AN_EMBEDDING
            }
        );
        assert_eq!(wrong(b"/predict", Reranker), Route::Predict);
        assert_eq!(wrong(b"/predict", Classifier), Route::Predict);
        assert!(matches!(
            wrong(b"/rerank", Classifier),
            Route::WrongModel { .. }
        ));
        assert!(matches!(
            wrong(b"/v2/rerank", Sparse),
            Route::WrongModel { .. }
        ));
        assert!(matches!(
            wrong(b"/similarity", Sparse),
            Route::WrongModel { .. }
        ));
        assert_eq!(wrong(b"/embed_sparse", Sparse), Route::EmbedSparse);
        // Every kind keeps the routes that need no forward pass, and the
        // method is checked before the kind.
        for k in [Embedding, Reranker, Classifier, Sparse] {
            assert_eq!(resolve(b"GET", b"/info", k), Route::Info);
            assert_eq!(wrong(b"/tokenize", k), Route::Tokenize);
            assert_eq!(
                resolve(b"GET", b"/rerank", k),
                Route::MethodNotAllowed { allow: "POST" }
            );
        }
        assert_eq!(
            served_by(Reranker),
            "POST /, POST /rerank, POST /predict, POST /v1/rerank, POST /v2/rerank, \
             POST /tokenize, POST /decode, GET /health, GET /info, GET /openapi.json, GET /v1/models"
        );
    }
}
