//! Typed errors of the tokenizer crate.

use thiserror::Error;

/// Everything that can go wrong when building a tokenizer from GGUF metadata, tokenizing,
/// detokenizing or rendering a chat template.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A required `tokenizer.*` metadata key is absent.
    #[error("GGUF metadata has no `{0}`")]
    MissingKey(&'static str),
    /// A metadata key holds a value of the wrong type or shape.
    #[error("GGUF metadata `{key}`: {what}")]
    BadValue {
        /// The metadata key.
        key: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer family frink does not implement
    /// (implemented: `gpt2` byte-level BPE, `llama` SentencePiece, `gemma4`, `bert`
    /// WordPiece and `t5` Unigram).
    #[error("unsupported tokenizer model `{0}` (tokenizer.ggml.model); frink implements `gpt2`, `llama`, `gemma4`, `bert` and `t5`")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a BPE pre-tokenizer frink has no verified implementation of.
    #[error("unsupported pre-tokenizer `{0}` (tokenizer.ggml.pre); frink implements {supported}", supported = crate::pretok::SUPPORTED.join(", "))]
    UnsupportedPreTokenizer(String),
    /// Two tokens share one text (llama.cpp refuses such a vocabulary too).
    #[error("duplicate token text {text:?} at ids {first} and {second}")]
    DuplicateToken {
        /// The repeated text.
        text: String,
        /// The first id carrying it.
        first: u32,
        /// The second id carrying it.
        second: u32,
    },
    /// A BPE merge whose parts or result are not tokens of the vocabulary: the result of
    /// such a merge could not be emitted as a token, and dropping the merge would change
    /// the tokenization, so the file is refused.
    #[error("BPE merge #{rank} {merge:?} refers to a text that is not in the vocabulary")]
    BadMerge {
        /// Index of the merge in `tokenizer.ggml.merges`.
        rank: usize,
        /// The merge line.
        merge: String,
    },
    /// `add_bos_token`/`add_eos_token` asks for a token the vocabulary does not define.
    #[error("`{flag}` is true but `{id_key}` is not set")]
    MissingSpecialToken {
        /// The `add_*_token` key.
        flag: &'static str,
        /// The id key that should name the token.
        id_key: &'static str,
    },
    /// The input needs a special token the vocabulary does not define: the unknown token
    /// for a Unigram or WordPiece text with unknown characters (where llama.cpp would emit
    /// the id -1), or a token of a pair encoding.
    #[error("this input needs the vocabulary's {what} token (`{key}`), which it does not define")]
    MissingToken {
        /// Which token (e.g. `unknown`).
        what: &'static str,
        /// The metadata key that would name it.
        key: &'static str,
    },
    /// Raw input bytes that decode, as llama.cpp's lenient UTF-8 reader decodes them, to a
    /// value beyond U+10FFFF, which WordPiece would have to re-encode (llama.cpp throws there
    /// too).
    #[error("input bytes decode to U+{0:X}, beyond Unicode; WordPiece cannot encode it")]
    BeyondUnicode(u32),
    /// A token id outside `0..n_vocab`.
    #[error("token id {id} is out of range (vocabulary has {n_vocab} tokens)")]
    IdOutOfRange {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// An error from the `tokenizers` crate (building the model or encoding).
    #[error("tokenizers: {0}")]
    Hf(String),
    /// The model has no chat template and none is known for its architecture.
    #[error(
        "model has no tokenizer.chat_template and no built-in template for architecture `{0}`: give one (`--chat-template` or `--chat-template-file` of `frink run`, `chat` and `serve`) or send the prompt as it is (`frink run --raw`, the server's /v1/completions)"
    )]
    NoChatTemplate(String),
    /// The chat template failed to compile or to render; carries the template engine's message
    /// (including the text given to `raise_exception`).
    #[error("chat template: {0}")]
    Template(String),
    /// The template alters message contents in a way that keeps frink from telling its own
    /// text apart from the user's, so the contents cannot be tokenized as literal text.
    #[error(
        "chat template transforms message contents (beyond trimming); cannot keep them literal"
    )]
    TemplateContentNotLiteral,
    /// Fill-in-the-middle asked of a vocabulary without its prefix, suffix and middle tokens.
    #[error("this model has no fill-in-the-middle tokens (its vocabulary lacks {missing}); use a code model with FIM tokens (e.g. qwen2.5-coder-0.5b)")]
    NoFim {
        /// The missing token kinds, e.g. `FIM prefix, FIM middle`.
        missing: String,
    },
    /// Could not read a model file.
    #[error(transparent)]
    Gguf(#[from] frink_gguf::GgufError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, TokenizerError>;
