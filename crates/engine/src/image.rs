//! Images in a prompt: each image's rows (from a projector, [`frink_models::vision`]) take
//! the place of its placeholder tokens, and the prompt carries **image keys** there
//! instead of token ids: values at or above [`IMAGE_KEY`], derived from a hash of the
//! image and the row, that no vocabulary reaches. The scheduler's prefix cache compares
//! and hashes prompts by these values, so the same image in a follow-up turn reuses its
//! cached rows, and a different image at the same place does not (a false match needs
//! every row's 31 bits to collide). The model reads a placeholder id at those rows,
//! replaced by the image's rows ([`frink_models::EmbdRows`]).

use std::sync::Arc;

use frink_models::rope::ImageGrid;
use frink_models::EmbdRows;
use sha2::{Digest, Sha256};

/// The lowest image key: token ids are below it (vocabularies stay far below 2³¹).
pub const IMAGE_KEY: u32 = 1 << 31;

/// Whether prompt value `t` is an image row's key, not a token id.
pub fn is_image_key(t: u32) -> bool {
    t >= IMAGE_KEY
}

/// The keys of an image's `n` rows: row `r`'s is 31 bits of SHA-256(`hash` ‖ `r`), with
/// the top bit set. `hash` identifies the image's content (its decoded pixels' hash).
pub fn image_keys(hash: &[u8], n: usize) -> Vec<u32> {
    image_keys_at(hash, 0, n)
}

/// The keys of rows `from .. from + n` of an image ([`image_keys`]).
pub fn image_keys_at(hash: &[u8], from: usize, n: usize) -> Vec<u32> {
    (from as u64..(from + n) as u64)
        .map(|r| {
            let d = Sha256::new()
                .chain_update(hash)
                .chain_update(r.to_le_bytes())
                .finalize();
            IMAGE_KEY | (u32::from_le_bytes([d[0], d[1], d[2], d[3]]) & (IMAGE_KEY - 1))
        })
        .collect()
}

/// One image of a request's prompt.
#[derive(Clone, Debug)]
pub struct PromptImage {
    /// The prompt index of its first row.
    pub at: usize,
    /// Its rows for the language model: `n × n_embd` values.
    pub rows: Arc<Vec<f32>>,
    /// The keys its rows carry in the prompt ([`image_keys`]).
    pub keys: Vec<u32>,
    /// Whether its rows see each other both ways ([`EmbdRows::bidirectional`]).
    pub bidirectional: bool,
    /// Where its rows sit in the image's grid, for a model with multimodal RoPE
    /// ([`EmbdRows::grid`]; `None` for every other model).
    pub grid: Option<ImageGrid>,
}

impl PromptImage {
    /// Its number of rows.
    pub fn n(&self) -> usize {
        self.keys.len()
    }
}

/// The ids the model reads for prompt values `keys`: each image key becomes
/// `placeholder` (its row is replaced by the image's).
pub fn model_ids(keys: &[u32], placeholder: u32) -> Vec<u32> {
    keys.iter()
        .map(|&t| if is_image_key(t) { placeholder } else { t })
        .collect()
}

/// The images of `images` with rows inside prompt positions `p0 .. p0 + len`.
pub fn reached(
    images: &[PromptImage],
    p0: usize,
    len: usize,
) -> impl Iterator<Item = &PromptImage> {
    images
        .iter()
        .filter(move |im| im.at.max(p0) < (im.at + im.n()).min(p0 + len))
}

/// The rows of `images` inside prompt positions `p0 .. p0 + len`, relative to `p0`.
pub fn embd_rows(
    images: &[PromptImage],
    p0: usize,
    len: usize,
    n_embd: usize,
) -> Vec<EmbdRows<'_>> {
    reached(images, p0, len)
        .map(|im| {
            let (a, b) = (im.at.max(p0), (im.at + im.n()).min(p0 + len));
            EmbdRows {
                at: a - p0,
                rows: &im.rows[(a - im.at) * n_embd..(b - im.at) * n_embd],
                bidirectional: im.bidirectional,
                grid: im.grid.map(|g| ImageGrid {
                    first: g.first + a - im.at,
                    ..g
                }),
            }
        })
        .collect()
}

/// How far the images of `images` that end by prompt position `n_past` moved the
/// positions after them back, with multimodal RoPE ([`frink_models::Sequence::rope_shift`]:
/// the shift of each image whose last row is among them; 0 for images without a grid).
pub fn rope_shift(images: &[PromptImage], n_past: usize) -> usize {
    images
        .iter()
        .filter(|im| im.at + im.n() <= n_past)
        .filter_map(|im| im.grid.filter(|g| g.first + im.n() == g.rows * g.cols))
        .map(|g| g.shift())
        .sum()
}

/// Checks a prompt's images: each inside the prompt where its keys are, in order, not
/// overlapping, with `n × n_embd` values; every other value a token id. Returns the
/// first problem, named.
pub fn check_images(prompt: &[u32], images: &[PromptImage], n_embd: usize) -> Result<(), String> {
    let mut end = 0;
    for (i, im) in images.iter().enumerate() {
        let n = im.n();
        if n == 0 || im.at < end || im.at + n > prompt.len() {
            return Err(format!(
                "image {i}: rows {}..{} are not inside the prompt after the previous image",
                im.at,
                im.at + n
            ));
        }
        if im.rows.len() != n * n_embd {
            return Err(format!(
                "image {i}: {} values for {n} rows of width {n_embd}",
                im.rows.len()
            ));
        }
        if prompt[im.at..im.at + n] != im.keys[..] {
            return Err(format!("image {i}: the prompt does not carry its keys"));
        }
        if prompt[end..im.at].iter().any(|&t| is_image_key(t)) {
            return Err(format!("an image key outside image {i}'s rows"));
        }
        end = im.at + n;
    }
    if prompt[end..].iter().any(|&t| is_image_key(t)) {
        return Err("an image key outside every image's rows".into());
    }
    Ok(())
}

/// Where a prefill chunk of `take` values from prompt index `pos` may end: never inside
/// an image whose rows see each other both ways (they must be evaluated in one call).
/// Shortened to the image's start, or, for a chunk that starts in or at the image,
/// lengthened to its end.
pub fn chunk_end(images: &[PromptImage], pos: usize, take: usize) -> usize {
    let end = pos + take;
    match images
        .iter()
        .find(|im| im.bidirectional && im.at < end && end < im.at + im.n())
    {
        Some(im) if im.at > pos => im.at - pos,
        Some(im) => im.at + im.n() - pos,
        None => take,
    }
}

/// The text that stands for an image in a prompt before its tokens are placed: llama.cpp's
/// default media marker (`mtmd_default_marker`), which its server's `multimodal_data`
/// prompts carry; frink's chat messages carry it where an image part was.
pub const IMAGE_MARKER: &str = "<__media__>";

/// An encoded image for [`image_prompt`]: its rows, the hash of its content and its text
/// in the prompt.
#[derive(Clone, Debug)]
pub struct EncodedImage {
    /// `n × n_embd` values, in the order the image tokens of `text` take them.
    pub rows: Arc<Vec<f32>>,
    /// Identifies the image ([`image_keys`]).
    pub hash: [u8; 32],
    /// What stands for the image in the prompt text, as the family's processor writes it:
    /// its markers and one image token per row (Gemma 3: `"\n\n<start_of_image>"`, 256 ×
    /// `<image_soft_token>`, `"<end_of_image>\n\n"`, transformers
    /// `Gemma3Processor.full_image_sequence`; Idefics3: a run per tile, transformers
    /// `Idefics3Processor.replace_image_token`).
    pub text: String,
    /// Its rows' grid `(rows, cols)` of merged patches, for a language model with
    /// multimodal RoPE (Qwen2.5-VL: one run of `rows · cols` image tokens); `None` for
    /// every other family.
    pub grid: Option<(usize, usize)>,
}

/// Checks that `text` holds one [`IMAGE_MARKER`] per image of `n` (cheap: before any
/// image is decoded).
///
/// Errors: the two counts, named.
pub fn check_places(text: &str, n: usize) -> Result<(), String> {
    let places = text.matches(IMAGE_MARKER).count();
    if places != n {
        return Err(format!(
            "{n} image(s) but {places} place(s) for them in the prompt ({IMAGE_MARKER})"
        ));
    }
    Ok(())
}

/// The prompt values and images of a rendered prompt `text` holding one
/// [`IMAGE_MARKER`] per image of `images`, in order: each marker becomes that image's
/// text ([`EncodedImage::text`]), tokenized with special tokens parsed there and in
/// `special` (byte ranges of `text`, sorted: the template's own text), literal elsewhere
/// (message contents); then each run of `image_token` takes the next rows of its image
/// (one [`PromptImage`] per run, its rows seeing each other both ways when
/// `bidirectional`).
///
/// Errors (named for the caller's message): markers and images of different counts, an
/// image token that is not one special token of the vocabulary, runs of it that are not
/// the images' rows (a prompt that spells them itself).
pub fn image_prompt(
    tok: &frink_tokenizer::Tokenizer,
    text: &str,
    special: &[std::ops::Range<usize>],
    image_token: &str,
    images: &[EncodedImage],
    bidirectional: bool,
) -> Result<(Vec<u32>, Vec<PromptImage>), String> {
    check_places(text, images.len())?;
    let image_id = tok
        .token_id(image_token)
        .ok_or_else(|| format!("the vocabulary has no {image_token} token"))?;
    let texts: Vec<&str> = images.iter().map(|im| im.text.as_str()).collect();
    let (out, ranges) = expand(text, special, &texts);
    let mut prompt = tok
        .encode_ranges(&out, &ranges, true)
        .map_err(|e| e.to_string())?;
    let counts: Vec<usize> = images
        .iter()
        .map(|im| im.text.matches(image_token).count())
        .collect();
    // Each run of the image token takes the next rows of the current image.
    let mut placed = Vec::new();
    let (mut k, mut done) = (0, 0);
    let mut i = 0;
    while i < prompt.len() {
        if prompt[i] != image_id {
            i += 1;
            continue;
        }
        let run = prompt[i..].iter().take_while(|&&t| t == image_id).count();
        let Some(im) = images.get(k).filter(|_| counts[k] > 0) else {
            return Err(format!(
                "the prompt holds {image_token} tokens past its images' rows"
            ));
        };
        let take = run.min(counts[k] - done);
        let width = im.rows.len() / counts[k];
        let rows = match (done, take) {
            (0, t) if t == counts[k] => Arc::clone(&im.rows),
            _ => Arc::new(im.rows[done * width..(done + take) * width].to_vec()),
        };
        let grid = match im.grid {
            Some((r, c)) if r * c == counts[k] => Some(ImageGrid {
                rows: r,
                cols: c,
                first: done,
            }),
            Some((r, c)) => {
                return Err(format!(
                    "image {k}: a {r} × {c} grid for {} {image_token} tokens",
                    counts[k]
                ))
            }
            None => None,
        };
        let keys = image_keys_at(&im.hash, done, take);
        prompt[i..i + take].copy_from_slice(&keys);
        placed.push(PromptImage {
            at: i,
            rows,
            keys,
            bidirectional,
            grid,
        });
        i += take;
        done += take;
        if done == counts[k] {
            (k, done) = (k + 1, 0);
        }
    }
    if k != images.len() || done != 0 {
        return Err(format!(
            "{k} image(s) placed of {}: the prompt lost an image's {image_token} tokens",
            images.len()
        ));
    }
    Ok((prompt, placed))
}

/// How many prompt values [`image_prompt`] will give for `text` with images whose texts
/// are `texts` ([`EncodedImage::text`], known from each image's size before it is
/// decoded): so a prompt past the context is refused before any image is encoded.
///
/// Errors: markers and texts of different counts; the tokenizer's.
pub fn prompt_len(
    tok: &frink_tokenizer::Tokenizer,
    text: &str,
    special: &[std::ops::Range<usize>],
    texts: &[&str],
) -> Result<usize, String> {
    check_places(text, texts.len())?;
    let (out, ranges) = expand(text, special, texts);
    tok.encode_ranges(&out, &ranges, true)
        .map(|ids| ids.len())
        .map_err(|e| e.to_string())
}

/// `text` with each [`IMAGE_MARKER`] replaced by its image's text (`texts`, in order), and
/// the byte ranges of the result where special tokens are parsed: `special`'s, moved, and
/// each image's text.
fn expand(
    text: &str,
    special: &[std::ops::Range<usize>],
    texts: &[&str],
) -> (String, Vec<std::ops::Range<usize>>) {
    let markers: Vec<usize> = text.match_indices(IMAGE_MARKER).map(|(i, _)| i).collect();
    let extra: usize = texts.iter().map(|t| t.len()).sum();
    let mut out = String::with_capacity(text.len() + extra);
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    let push = |ranges: &mut Vec<std::ops::Range<usize>>, r: std::ops::Range<usize>| match ranges
        .last_mut()
    {
        Some(last) if last.end == r.start => last.end = r.end,
        _ if r.is_empty() => {}
        _ => ranges.push(r),
    };
    let mut src = 0;
    for (k, &m) in markers
        .iter()
        .chain(std::iter::once(&text.len()))
        .enumerate()
    {
        // The caller's special ranges within src..m, moved to the new text.
        let base = out.len();
        for r in special {
            let (a, b) = (r.start.max(src), r.end.min(m));
            if a < b {
                push(&mut ranges, base + a - src..base + b - src);
            }
        }
        out.push_str(&text[src..m]);
        let Some(im) = texts.get(k).filter(|_| m < text.len()) else {
            break;
        };
        let start = out.len();
        out.push_str(im);
        push(&mut ranges, start..out.len());
        src = m + IMAGE_MARKER.len();
    }
    (out, ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(at: usize, n: usize, seed: u8, bidi: bool) -> PromptImage {
        PromptImage {
            at,
            rows: Arc::new(vec![seed as f32; n * 2]),
            keys: image_keys(&[seed], n),
            bidirectional: bidi,
            grid: None,
        }
    }

    #[test]
    fn keys_differ_by_image_and_row_and_stay_above_token_ids() {
        let (a, b) = (image_keys(b"one", 8), image_keys(b"two", 8));
        assert!(a.iter().chain(&b).all(|&k| is_image_key(k)));
        assert_eq!(a, image_keys(b"one", 8));
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        let mut s = a.clone();
        s.dedup();
        assert_eq!(s.len(), 8);
    }

    #[test]
    fn rows_of_a_chunk_and_chunk_ends() {
        let ims = [image(2, 4, 1, true), image(8, 2, 2, false)];
        let rows = embd_rows(&ims, 3, 6, 2); // positions 3..9
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].at, rows[0].rows.len()), (0, 6)); // image rows 1..4
        assert_eq!((rows[1].at, rows[1].rows.len()), (5, 2)); // position 8
                                                              // A chunk ending inside the two-way image stops before it, or takes it whole.
        assert_eq!(chunk_end(&ims, 0, 4), 2);
        assert_eq!(chunk_end(&ims, 2, 1), 4);
        assert_eq!(chunk_end(&ims, 3, 1), 3);
        // The causal image may be split.
        assert_eq!(chunk_end(&ims, 0, 9), 9);
    }

    #[test]
    fn checks_refuse_keys_without_an_image_and_misplaced_images() {
        let im = image(1, 2, 3, true);
        let mut prompt = vec![5, 0, 0, 6];
        prompt[1..3].copy_from_slice(&im.keys);
        assert!(check_images(&prompt, std::slice::from_ref(&im), 2).is_ok());
        assert!(check_images(&prompt, &[], 2).is_err());
        let mut moved = im.clone();
        moved.at = 2;
        assert!(check_images(&prompt, &[moved], 2).is_err());
        assert!(check_images(&prompt, std::slice::from_ref(&im), 3).is_err());
    }
}
