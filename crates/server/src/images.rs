//! Images in requests: where their bytes come from (`data:` URIs, base64, `http(s)` URLs
//! with `--allow-image-urls`), their encoding by the model's projector file, and the
//! prompt with their rows in place ([`frink_engine::image`]).

use std::io::Read;
use std::ops::Range;
use std::time::Duration;

use axum::http::StatusCode;
use frink_engine::image::PromptImage;
use frink_models::vision::VisionModel;

use crate::api::request::ImageSource;
use crate::api::ApiError;
use crate::engine::Engine;

/// How a server takes images (`--allow-image-urls`, `--image-max-pixels`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ImageLimits {
    pub(crate) allow_urls: bool,
    pub(crate) max_pixels: u64,
}

/// The most bytes an image fetched by URL may have.
const MAX_URL_BYTES: u64 = 32 << 20;
/// How long fetching an image by URL may take, connection included.
const URL_TIMEOUT: Duration = Duration::from_secs(20);

/// The projector of `eng`, or a 400 naming `model` for a model without one.
pub(crate) fn vision<'a>(
    eng: &'a Engine,
    model: &str,
    param: &str,
) -> Result<&'a VisionModel, ApiError> {
    eng.vision.as_deref().ok_or_else(|| {
        ApiError::invalid(
            Some(param),
            format!(
                "model {model:?} does not take images: it is served without a projector file \
                 (frink serve --mmproj FILE)"
            ),
        )
    })
}

/// The bytes of image `src`: a `data:` URI's (base64 or percent-free plain), bare base64
/// (Ollama's `images`, llama.cpp's `multimodal_data`), or an `http(s)` URL's, fetched only
/// when `limits.allow_urls`.
///
/// Errors: a 400 naming `src.param`: undecodable base64, a URL not allowed, a fetch that
/// failed, took too long or was too large.
pub(crate) fn bytes(src: &ImageSource, limits: ImageLimits) -> Result<Vec<u8>, ApiError> {
    let bad = |m: String| ApiError::invalid(Some(&src.param), m);
    let url = src.url.trim();
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, data) = rest
            .split_once(',')
            .ok_or_else(|| bad("a data URI without a comma before its data".into()))?;
        if !meta.to_ascii_lowercase().ends_with(";base64") {
            return Err(bad(
                "a data URI's image must be base64 (data:image/png;base64,…)".into(),
            ));
        }
        return base64_bytes(data).map_err(bad);
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        if !limits.allow_urls {
            return Err(bad(
                "images given by URL are fetched only when the server runs with \
                 --allow-image-urls; send the image as a data URI (data:image/png;base64,…)"
                    .into(),
            ));
        }
        return fetch(url).map_err(bad);
    }
    base64_bytes(url).map_err(|e| bad(format!("not a data URI, an http(s) URL or base64: {e}")))
}

fn base64_bytes(data: &str) -> Result<Vec<u8>, String> {
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::decode(clean.as_bytes()).map_err(|e| format!("invalid base64: {e}"))
}

/// GET `url` within [`URL_TIMEOUT`] and [`MAX_URL_BYTES`].
fn fetch(url: &str) -> Result<Vec<u8>, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(URL_TIMEOUT)
        .redirects(3)
        .build();
    let resp = agent
        .get(url)
        .call()
        .map_err(|e| format!("fetching the image failed: {e}"))?;
    let mut body = Vec::new();
    resp.into_reader()
        .take(MAX_URL_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("reading the image failed: {e}"))?;
    if body.len() as u64 > MAX_URL_BYTES {
        return Err(format!("the image is larger than {MAX_URL_BYTES} bytes"));
    }
    Ok(body)
}

fn too_many_rows(param: &str, n: usize, rows: usize, n_ctx: usize) -> ApiError {
    ApiError::invalid(
        Some(param),
        format!("{n} image(s) take at least {rows} positions, more than the context of {n_ctx}"),
    )
    .with_code("context_length_exceeded")
}

/// The prompt of a rendered text (`special`: its byte ranges parsed for special tokens)
/// holding one [`frink_engine::image::IMAGE_MARKER`] per image of `sources`, with the
/// images encoded and placed. What costs nothing is checked before what costs: the
/// markers and a lower bound of the images' rows before any image is read; every image's
/// header, layout and so the whole prompt's length before any pixel is decoded; only then
/// is each image decoded and encoded.
///
/// Errors: those of [`vision`] and [`bytes`]; a 400 on `param` when the markers and
/// images do not match or the prompt passes the context of `n_ctx` positions; a 400 on the
/// image's field for bytes that are not an image of a supported format or that pass the
/// pixel limit; a 500 if the encoder fails.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prompt(
    eng: &Engine,
    model: &str,
    text: &str,
    special: &[Range<usize>],
    sources: &[ImageSource],
    limits: ImageLimits,
    n_ctx: usize,
    param: &str,
) -> Result<(Vec<u32>, Vec<PromptImage>), ApiError> {
    use frink_vision::input;
    let vm = vision(eng, model, &sources[0].param)?;
    frink_engine::image::check_places(text, sources.len())
        .map_err(|e| ApiError::invalid(Some(param), e))?;
    // Each image takes at least one encoder input's rows: refused before reading any.
    let rows = sources.len().saturating_mul(vm.config.min_rows_per_image());
    if rows > n_ctx {
        return Err(too_many_rows(param, sources.len(), rows, n_ctx));
    }
    let mut data = Vec::with_capacity(sources.len());
    let mut texts = Vec::with_capacity(sources.len());
    for src in sources {
        let d = bytes(src, limits)?;
        let (w, h) = frink_vision::preprocess::dimensions(&d, limits.max_pixels)
            .map_err(|e| ApiError::invalid(Some(&src.param), e.to_string()))?;
        let (_, grid) = input::layout(vm, w, h)
            .map_err(|e| ApiError::invalid(Some(&src.param), e.to_string()))?;
        texts.push(input::image_text(vm, grid));
        data.push(d);
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let n = frink_engine::image::prompt_len(&eng.tok, text, special, &refs)
        .map_err(|e| ApiError::invalid(Some(param), e))?;
    if n > n_ctx {
        return Err(ApiError::invalid(
            Some(param),
            format!(
                "the prompt with its {} image(s) takes {n} positions, more than the context of {n_ctx}",
                sources.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let encoded = data
        .iter()
        .zip(sources)
        .map(|(d, src)| {
            input::encode_image(vm, d, limits.max_pixels).map_err(|e| match e {
                frink_vision::preprocess::ImageError::Encode(m) => ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    format!("encoding the image failed: {m}"),
                ),
                e => ApiError::invalid(Some(&src.param), e.to_string()),
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    input::prompt(vm, &eng.tok, text, special, &encoded)
        .map_err(|e| ApiError::invalid(Some(param), e))
}
