//! `libm0_embed.so`: the embedding plugin with the native encoder.

m0serve_plugin::export!(embed::Embed<embed::model::Model>);
