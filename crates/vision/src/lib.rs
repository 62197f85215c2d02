//! Image input for vision-language models: decoding and preprocessing as each family's
//! processor does it ([`preprocess`]), and the way from an image file to the language
//! model's rows and the image's place in the prompt ([`input`]). The projector file and its
//! encoder are [`frink_models::vision`].

pub mod input;
pub mod preprocess;
