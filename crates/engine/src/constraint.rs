//! Constrained decoding: a grammar (a JSON schema, a regex or a Lark grammar) turned into
//! the set of tokens allowed at each step, on the `llguidance` crate.
//!
//! [`GrammarCompiler::new`] builds, once per model, `llguidance`'s token trie from the
//! vocabulary: each token's bytes as frink detokenizes it (`token_to_piece`), control and
//! unknown tokens as special tokens (`0xFF` then their text, toktrie's marker), unused
//! slots as empty (never allowed), and the model's end-of-generation ids as its EOS set.
//! [`GrammarCompiler::compile`] checks a grammar and gives a [`Constraint`], one per
//! sequence: [`Constraint::masked`] bans what the next step does not allow (only the EOS set once the
//! grammar is complete, so the answer ends with `finish_reason: "stop"`), and
//! [`Constraint::commit`] advances it by the sampled token. The mask is applied to the
//! logits before the sampler's chain (see [`crate::sampling::Sampler::with_constraint`]), so
//! every sampling mode works under a constraint; tokens are never forced past the sampler
//! (no multi-token fast-forward: its canonical tokenization may differ from the model's).
//!
//! A schema or grammar feature `llguidance` cannot enforce is a compile error naming it
//! (its JSON compiler refuses unknown keywords unless the schema asks to be lenient), never
//! a silently relaxed constraint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use frink_tokenizer::{TokenAttr, Tokenizer};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, SimpleVob, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

/// What a request asks its answer to match.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// Any JSON value valid against this JSON schema (draft 2020-12 as `llguidance`
    /// implements it).
    JsonSchema(serde_json::Value),
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// The whole answer matches this regular expression (Rust `regex` syntax).
    Regex(String),
    /// A grammar in `llguidance`'s Lark syntax (llama.cpp's `%llguidance` grammars; that
    /// first line is a directive of the syntax).
    Lark(String),
}

impl Grammar {
    /// A grammar as llama.cpp reads its `grammar` field and `--grammar-file`: text whose
    /// first line starts with `%llguidance` is llguidance's Lark syntax (llama.cpp's
    /// llguidance build); anything else is GBNF, converted to Lark by
    /// [`crate::gbnf::gbnf_to_lark`].
    ///
    /// Errors: GBNF that does not parse or uses what frink does not convert (token
    /// references), with its line.
    pub fn from_grammar_text(text: &str) -> Result<Grammar, GrammarError> {
        if text.trim_start().starts_with("%llguidance") {
            Ok(Grammar::Lark(text.to_string()))
        } else {
            crate::gbnf::gbnf_to_lark(text).map(Grammar::Lark)
        }
    }
}

/// A grammar that cannot be compiled: `llguidance`'s message, which names the construct.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(pub String);

/// frink's tokenizer as `llguidance` sees it: the trie of token bytes, and tokenization of
/// the grammar's literal text by frink's own tokenizer.
struct TokEnv {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for TokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Tokens whose bytes are exactly `s` (`llguidance` asks for the tokens of a grammar's
    /// literal text, also of a prefix that ends inside a character): each run of whole
    /// characters by frink's tokenizer, kept only if its tokens spell the run exactly (a
    /// SentencePiece vocabulary may add a leading space); anything else (an incomplete
    /// character, a run frink would spell differently) by the trie's greedy split, which is
    /// exact bytes.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        let mut out = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            let (text, bad) = match std::str::from_utf8(rest) {
                Ok(t) => (t, &rest[rest.len()..]),
                Err(e) => {
                    let (ok, bad) = rest.split_at(e.valid_up_to());
                    (std::str::from_utf8(ok).unwrap_or_default(), bad)
                }
            };
            if !text.is_empty() {
                match self.tok.encode(text, false, false) {
                    Ok(ids) if self.trie.decode(&ids) == text.as_bytes() => out.extend(ids),
                    _ => out.extend(self.trie.greedy_tokenize(text.as_bytes())),
                }
            }
            // One undecodable sequence (or the incomplete character at the end), then on.
            let n = match std::str::from_utf8(bad) {
                Ok(_) => bad.len(),
                Err(e) => e.error_len().unwrap_or(bad.len()),
            };
            out.extend(self.trie.greedy_tokenize(&bad[..n]));
            rest = &bad[n..];
        }
        out
    }
}

/// The per-model part of constrained decoding: the token trie and `llguidance`'s parser
/// factory. Cheap to share (`Arc` inside); building it walks the vocabulary once.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    tok: Arc<Tokenizer>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// The compiler for `tok`'s vocabulary.
    ///
    /// Errors: a vocabulary without end-of-generation tokens (a constrained answer could
    /// never end), or `llguidance` rejecting the trie.
    pub fn new(tok: Arc<Tokenizer>) -> Result<GrammarCompiler, GrammarError> {
        let n = tok.n_vocab();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let attr = tok.token_attr(id).unwrap_or_default();
                if attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tok.token_text(id).unwrap_or_default().as_bytes());
                    w
                } else {
                    tok.token_to_piece(id, true).unwrap_or_default().to_vec()
                }
            })
            .collect();
        let eog = tok.eog_ids().to_vec();
        let Some(&first) = eog.first() else {
            return Err(GrammarError(
                "the vocabulary has no end-of-generation token: a constrained answer could not end"
                    .into(),
            ));
        };
        let mut info = TokRxInfo::new(n as u32, first);
        info.tok_bos = tok.bos_id();
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: toktrie::TokEnv = Arc::new(TokEnv {
            tok: Arc::clone(&tok),
            trie,
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError(e.to_string()))?;
        factory.quiet();
        // Errors say what is wrong in a sentence; the parser's state and the grammar are
        // not for the client (they were tens of lines per message).
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            tok,
        })
    }

    /// Compiles `grammar` into a fresh [`Constraint`] at the start of an answer.
    ///
    /// Errors: [`GrammarError`] naming what cannot be compiled (an invalid or unsupported
    /// schema keyword, a bad regex, a Lark syntax error).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let top = match grammar {
            Grammar::JsonSchema(schema) => {
                TopLevelGrammar::from_json_schema(json_schema_defaults(schema))
            }
            Grammar::JsonObject => TopLevelGrammar::from_json_schema(json_schema_defaults(
                &serde_json::json!({"type": "object"}),
            )),
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            // A leading `%llguidance {}` (llama.cpp's marker) is a directive of this syntax.
            Grammar::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError(one_line(&e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(one_line(&e)));
        }
        let mut c = Constraint {
            matcher,
            busy: Duration::ZERO,
            ready: None,
            phase: Phase::Active,
        };
        // The first step's mask, computed now: a grammar that admits no text at all (a
        // schema that only refers to itself) is refused here, and every choice cloned from
        // this constraint starts with its mask ready.
        c.prepare();
        if let Some(Err(e)) = &c.ready {
            return Err(GrammarError(format!(
                "the grammar admits no text ({})",
                one_line(e)
            )));
        }
        Ok(c)
    }

    /// Compiles `grammar` into a lazy [`Constraint`]: the answer is free until one of
    /// `triggers` appears in it, and from that trigger's first byte on it must match
    /// `grammar` (which therefore starts with what each trigger starts). llama.cpp's lazy
    /// grammars, as its tool calling with `tool_choice: "auto"` uses them: text before a
    /// call is the model's, the call is the grammar's. A trigger token that carries text the
    /// grammar refuses (the model wrote a marker inside a word) leaves the rest free.
    ///
    /// Errors: as [`GrammarCompiler::compile`].
    pub fn compile_lazy(
        &self,
        grammar: &Grammar,
        triggers: Vec<Trigger>,
    ) -> Result<Constraint, GrammarError> {
        let mut c = self.compile(grammar)?;
        c.phase = Phase::Waiting(Box::new(Waiting {
            triggers,
            seen: Vec::new(),
            tok: Arc::clone(&self.tok),
        }));
        Ok(c)
    }
}

/// `llguidance`'s message on one line, without the parser state it may carry after
/// `<state>` (its verbose form), the backtrace of a panic it caught, or the
/// `<non-verbose/>` mark of its short form.
fn one_line(msg: &str) -> String {
    let end = ["<state>", "<backtrace>"]
        .iter()
        .filter_map(|m| msg.find(m))
        .min()
        .unwrap_or(msg.len());
    let head = msg[..end].replace("<non-verbose/>", "");
    let head = head.split_whitespace().collect::<Vec<_>>().join(" ");
    // llguidance catches its own panics (an internal limit such as 65,535 symbols) and
    // reports them with the assertion's text.
    if head.contains("coerce_one_of") {
        // (llguidance names an option of its own, which no request can set.)
        return "'oneOf' with branches that can match the same value is not supported: \
                frink cannot enforce that exactly one matches; use 'anyOf' (any branch may \
                match), or make the branches exclusive (e.g. by 'type' or a 'const' field)"
            .to_string();
    }
    match head.strip_prefix("panic: ") {
        Some(p) => format!("the grammar is beyond what llguidance can compile (too large?): {p}"),
        None => head,
    }
}

/// What starts a lazy constraint ([`GrammarCompiler::compile_lazy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// This token (a control token such as Mistral's `[TOOL_CALLS]`).
    Token(u32),
    /// This text, wherever the answer's bytes contain it.
    Text(String),
    /// This text at the start of the answer only, whitespace in the answer before and
    /// between its characters skipped (a call object that starts `{\n  "name"`).
    Prefix(String),
}

/// A lazy constraint before its trigger.
#[derive(Clone)]
struct Waiting {
    triggers: Vec<Trigger>,
    /// The answer's bytes so far.
    seen: Vec<u8>,
    tok: Arc<Tokenizer>,
}

impl Waiting {
    /// Records the committed `id`; returns the tokens the grammar must start from if a
    /// trigger is now complete: the earliest trigger's text onward, tokenized afresh (the
    /// grammar reads bytes, and any tokenization of them is accepted alike).
    fn fire(&mut self, id: u32) -> Option<Vec<u32>> {
        if self.triggers.contains(&Trigger::Token(id)) {
            return Some(vec![id]);
        }
        let before = self.seen.len();
        self.seen
            .extend_from_slice(self.tok.token_to_piece(id, false).unwrap_or_default());
        let seen = &self.seen;
        let at = self
            .triggers
            .iter()
            .filter_map(|t| match t {
                Trigger::Token(_) => None,
                Trigger::Text(text) => {
                    // Only where the new bytes could complete it.
                    let t = text.as_bytes();
                    let from = before.saturating_sub(t.len().saturating_sub(1));
                    seen[from..]
                        .windows(t.len())
                        .position(|w| w == t)
                        .map(|i| from + i)
                }
                Trigger::Prefix(text) => loose_prefix(seen, text.as_bytes()),
            })
            .min()?;
        Some(
            self.tok
                .encode_bytes(&self.seen[at..], false, false)
                .unwrap_or_default(),
        )
    }
}

/// Where `text` starts in `seen` if `seen` begins with it, ASCII whitespace skipped before
/// and between its bytes.
fn loose_prefix(seen: &[u8], text: &[u8]) -> Option<usize> {
    let mut at = None;
    let mut i = 0;
    for &want in text {
        while seen.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        if *seen.get(i)? != want {
            return None;
        }
        at.get_or_insert(i);
        i += 1;
    }
    at
}

/// Where a constraint is.
#[derive(Clone)]
enum Phase {
    /// The grammar applies.
    Active,
    /// Lazy, before its trigger: nothing is masked.
    Waiting(Box<Waiting>),
    /// Lazy, and the trigger's token carried text the grammar refuses: nothing is masked.
    Off,
}

/// The whitespace a JSON answer may put between its tokens: one space, or one or two
/// newlines and up to 20 spaces or tabs of indentation: llama.cpp's `SPACE_RULE`
/// (common/json-schema-to-grammar.cpp). `llguidance`'s default allows any run of
/// whitespace, and a small model then fills its budget with newlines inside an object.
/// (The server's tool-call grammars embed their JSON with the same layout.)
pub const JSON_WHITESPACE: &str = r"(?:\x20|\x0A{1,2}[\x20\x09]{0,20})";

/// Calls `f` on `v` and every subschema below it, through the keywords that hold
/// subschemas (so a property that happens to be named `properties` is left alone).
fn each_schema(
    v: &mut serde_json::Value,
    f: &mut impl FnMut(&mut serde_json::Map<String, serde_json::Value>),
) {
    use serde_json::Value;
    let Value::Object(o) = v else {
        return;
    };
    f(o);
    for (k, sub) in o.iter_mut() {
        match k.as_str() {
            "properties" | "$defs" | "definitions" | "patternProperties" | "dependentSchemas" => {
                if let Value::Object(m) = sub {
                    m.values_mut().for_each(|s| each_schema(s, f));
                }
            }
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                if let Value::Array(a) = sub {
                    a.iter_mut().for_each(|s| each_schema(s, f));
                }
            }
            "items"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedItems"
            | "unevaluatedProperties" => each_schema(sub, f),
            _ => {}
        }
    }
}

/// Sets `additionalProperties: false` on an object schema that lists `properties` and
/// says nothing about other keys (no `additionalProperties`, `patternProperties` or
/// `unevaluatedProperties`), as llama.cpp's json-schema-to-grammar does
/// (common/json-schema-to-grammar.cpp): the answer still validates against the schema as
/// written, and a small model no longer invents keys until its budget runs out.
fn close_object(o: &mut serde_json::Map<String, serde_json::Value>) {
    if o.contains_key("properties")
        && ![
            "additionalProperties",
            "patternProperties",
            "unevaluatedProperties",
        ]
        .iter()
        .any(|k| o.contains_key(*k))
    {
        o.insert(
            "additionalProperties".into(),
            serde_json::Value::Bool(false),
        );
    }
}

/// Drops the keywords whose value constrains nothing, which llguidance refuses as
/// unimplemented even then: `uniqueItems: false`, an empty `dependentRequired` (or one
/// whose lists are all empty), an empty `dependentSchemas`. (Their constraining values
/// stay, and are refused naming the keyword.)
fn drop_neutral(o: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::Value;
    o.retain(|k, v| match (k.as_str(), &*v) {
        ("uniqueItems", Value::Bool(false)) => false,
        ("dependentRequired", Value::Object(m)) => {
            !m.values().all(|l| l.as_array().is_some_and(Vec::is_empty))
        }
        ("dependentSchemas", Value::Object(m)) => !m.is_empty(),
        _ => true,
    });
}

/// `schema` with frink's JSON defaults: objects that list their properties closed
/// ([`close_object`]), keywords that constrain nothing dropped ([`drop_neutral`]) and the
/// layout bounded, unless the schema sets its own layout
/// (`x-guidance`). What every JSON schema frink enforces gets (`response_format`,
/// `json_schema`, tool-call arguments).
pub fn json_schema_defaults(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    each_schema(&mut schema, &mut |o| {
        drop_neutral(o);
        close_object(o);
    });
    if let Some(obj) = schema.as_object_mut() {
        if !obj.contains_key("x-guidance") {
            let opts = llguidance::JsonCompileOptions {
                whitespace_pattern: Some(JSON_WHITESPACE.to_string()),
                ..Default::default()
            };
            opts.apply_to(&mut schema);
        }
    }
    schema
}

/// One sequence's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    /// Time spent computing masks and committing tokens so far.
    busy: Duration,
    /// The next step's mask, computed ahead by [`Constraint::prepare`].
    ready: Option<Result<SimpleVob, String>>,
    phase: Phase,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .finish_non_exhaustive()
    }
}

impl Constraint {
    /// Writes into `out` (resized to `logits.len()`) the logits of the tokens the grammar
    /// allows next and `-inf` everywhere else; once the grammar is complete only the
    /// end-of-generation tokens remain. Ids past the vocabulary (a padded output row) are
    /// banned. (One fill and one pass over the allowed ids: in a JSON structure a few dozen
    /// of a 150k vocabulary.)
    ///
    /// Errors: the grammar is in an error state (`llguidance`'s message); `out` is then
    /// all `-inf`.
    pub fn masked(&mut self, logits: &[f32], out: &mut Vec<f32>) -> Result<(), GrammarError> {
        if !matches!(self.phase, Phase::Active) {
            out.clear();
            out.extend_from_slice(logits);
            return Ok(());
        }
        self.prepare();
        let t = Instant::now();
        let vob = self.ready.take().expect("prepare leaves a mask ready");
        out.clear();
        out.resize(logits.len(), f32::NEG_INFINITY);
        let r = vob.map(|vob| {
            vob.iter_set_entries(|id| {
                if let (Some(o), Some(&l)) = (out.get_mut(id), logits.get(id)) {
                    *o = l;
                }
            })
        });
        self.busy += t.elapsed();
        r.map_err(|e| GrammarError(one_line(&e)))
    }

    /// Time spent in [`Constraint::masked`] and [`Constraint::commit`] so far.
    pub fn busy(&self) -> Duration {
        self.busy
    }

    /// Computes the next step's mask now (for instance on another thread while the forward
    /// pass runs), so that [`Constraint::masked`] only applies it. The same mask either way:
    /// it depends only on the tokens committed so far.
    pub fn prepare(&mut self) {
        if self.ready.is_none() && matches!(self.phase, Phase::Active) {
            let t = Instant::now();
            self.ready = Some(
                self.matcher
                    .compute_mask_or_eos()
                    .map_err(|e| e.to_string()),
            );
            self.busy += t.elapsed();
        }
    }

    /// Advances the grammar by the sampled token `id` (an end-of-generation token ends it).
    ///
    /// Errors: `id` is not allowed here (it was not sampled from a masked row).
    pub fn commit(&mut self, id: u32) -> Result<(), GrammarError> {
        match &mut self.phase {
            Phase::Active => {}
            Phase::Off => return Ok(()),
            Phase::Waiting(w) => {
                let t = Instant::now();
                if let Some(ids) = w.fire(id) {
                    self.ready = None;
                    self.phase = match self.matcher.consume_tokens(&ids) {
                        Ok(()) => Phase::Active,
                        Err(_) => Phase::Off,
                    };
                }
                self.busy += t.elapsed();
                return Ok(());
            }
        }
        if self.matcher.is_stopped() {
            return Ok(());
        }
        self.ready = None;
        let t = Instant::now();
        let r = self.matcher.consume_token(id);
        self.busy += t.elapsed();
        r.map_err(|e| GrammarError(one_line(&e.to_string())))
    }

    /// Whether the grammar has reached its end (only end-of-generation tokens are allowed).
    pub fn is_complete(&self) -> bool {
        matches!(self.phase, Phase::Active) && self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::{close_object, drop_neutral, each_schema, one_line};

    /// llguidance's verbose messages (taken from its output) become one sentence.
    #[test]
    fn grammar_errors_lose_parser_state_and_backtraces() {
        assert_eq!(
            one_line("NoExtensionBias\n<state>\nTokens: ⟦⟧\nParser: {\n  \"rows\": 1\n}"),
            "NoExtensionBias"
        );
        assert_eq!(
            one_line("parser error: Too many items (limit 50000; ff_tokens) <non-verbose/>"),
            "parser error: Too many items (limit 50000; ff_tokens)"
        );
        let panic = one_line(
            "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n\
             <backtrace>\n   0: llguidance::panic_utils::catch_unwind",
        );
        assert!(panic.starts_with("the grammar is beyond"), "{panic}");
        assert!(
            !panic.contains("backtrace") && !panic.contains('\n'),
            "{panic}"
        );
    }
    use serde_json::json;

    /// Objects that list properties are closed unless they say otherwise; subschemas under
    /// properties, items, anyOf and $defs too; a property named `properties` is not a schema
    /// keyword; an object without `properties` (any JSON object) stays open.
    #[test]
    fn objects_listing_properties_are_closed() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "properties": {"type": "string"},
                "inner": {"type": "object", "properties": {"a": {}}},
                "open": {"type": "object", "properties": {"b": {}}, "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"c": {}}}}
            },
            "$defs": {"d": {"anyOf": [{"properties": {"e": {}}}, {"type": "object"}]}}
        });
        each_schema(&mut s, &mut close_object);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["inner"]["additionalProperties"], false);
        assert_eq!(s["properties"]["open"]["additionalProperties"], true);
        assert_eq!(
            s["properties"]["list"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(s["$defs"]["d"]["anyOf"][0]["additionalProperties"], false);
        assert!(s["$defs"]["d"]["anyOf"][1]
            .get("additionalProperties")
            .is_none());
        assert!(s["properties"].get("additionalProperties").is_none());
        assert!(s["properties"]["properties"]
            .get("additionalProperties")
            .is_none());
    }

    /// Neutral values go (below the top too), constraining ones stay to be refused.
    #[test]
    fn neutral_keywords_are_dropped() {
        let mut s = json!({
            "type": "array", "uniqueItems": false,
            "items": {"type": "object", "properties": {"a": {}}, "dependentRequired": {"a": []},
                      "dependentSchemas": {}},
            "anyOf": [{"uniqueItems": true}, {"dependentRequired": {"a": ["b"]}}]
        });
        each_schema(&mut s, &mut drop_neutral);
        assert!(s.get("uniqueItems").is_none());
        assert!(s["items"].get("dependentRequired").is_none());
        assert!(s["items"].get("dependentSchemas").is_none());
        assert_eq!(s["anyOf"][0]["uniqueItems"], true);
        assert_eq!(s["anyOf"][1]["dependentRequired"]["a"][0], "b");
    }
}
