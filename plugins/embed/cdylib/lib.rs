//! `libm0_embed.so`: the embedding plugin with the native encoder, or the
//! forward-pass library `M0_EMBED_BACKEND` names (chosen in each worker).

m0serve_plugin::export!(embed::Embed<embed::native_backend::EmbedBackend>);
