//! Which handler a request line goes to.

/// Where a request goes, decided from its method and path alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST /embed` or `POST /` (where huggingface_hub's
    /// `InferenceClient.feature_extraction` posts): parse with
    /// [`super::parse_tei`], answer with [`super::write_tei`].
    Embed,
    /// `POST /v1/embeddings` (also `POST /embeddings`, which TEI serves
    /// too): parse with [`super::parse_openai`], answer with
    /// [`super::write_openai`].
    OpenAiEmbeddings,
    /// `POST /embed_all`: every token's vector, [`super::parse_embed_all`].
    EmbedAll,
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
    /// No such path: answer [`super::ApiError::not_found`].
    NotFound,
    /// A known path with the wrong method: answer
    /// [`super::ApiError::method_not_allowed`], with an `Allow: {allow}`
    /// header.
    MethodNotAllowed {
        /// The `Allow` header value.
        allow: &'static str,
    },
}

const POST: &str = "POST";
const GET: &str = "GET, HEAD";

/// Every path this API answers, where it goes and the methods it takes
/// (the `Allow` value of a 405). The OpenAPI document lists the same paths
/// and methods; a unit test of `openapi` holds the two equal.
pub const ROUTES: &[(&str, Route, &str)] = &[
    ("/embed", Route::Embed, POST),
    ("/", Route::Embed, POST),
    ("/v1/embeddings", Route::OpenAiEmbeddings, POST),
    ("/embeddings", Route::OpenAiEmbeddings, POST),
    ("/embed_all", Route::EmbedAll, POST),
    ("/tokenize", Route::Tokenize, POST),
    ("/decode", Route::Decode, POST),
    ("/health", Route::Health, GET),
    ("/info", Route::Info, GET),
    ("/openapi.json", Route::OpenApi, GET),
];

/// Routes a request. `path` is the request target; a query string
/// (`?...`) is ignored. Methods are case-sensitive, as HTTP says.
pub fn route(method: &[u8], path: &[u8]) -> Route {
    let path = match path.iter().position(|&b| b == b'?') {
        Some(q) => &path[..q],
        None => path,
    };
    let Some(&(_, target, allow)) = ROUTES.iter().find(|(p, _, _)| p.as_bytes() == path) else {
        return Route::NotFound;
    };
    let ok = match allow {
        POST => method == b"POST",
        _ => method == b"GET" || method == b"HEAD",
    };
    if ok {
        target
    } else {
        Route::MethodNotAllowed { allow }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_routes() {
        assert_eq!(route(b"POST", b"/embed"), Route::Embed);
        assert_eq!(route(b"POST", b"/"), Route::Embed);
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
    }

    #[test]
    fn query_strings_are_ignored() {
        assert_eq!(route(b"POST", b"/embed?x=1"), Route::Embed);
        assert_eq!(route(b"GET", b"/info?"), Route::Info);
        assert_eq!(route(b"POST", b"/?wait_for_model=true"), Route::Embed);
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
}
