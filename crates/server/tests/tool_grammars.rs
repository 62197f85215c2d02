//! The grammars that enforce `tool_choice: "required"` (or a named function) in every tool
//! format: each admits the recorded call of its format (the shape the family's template
//! writes into the history) token by token, ends only where the call is complete, and
//! refuses a call whose arguments break the tool's schema. Markers that are control tokens
//! of the vocabulary must be sampled as those tokens, so the test vocabulary makes them
//! control tokens (Qwen's `<tool_call>` is a user-defined token, as in Qwen's files).

use std::sync::Arc;

use frink_engine::constraint::{Grammar, GrammarCompiler};
use frink_gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use frink_server::tools::{ToolFormat, ToolSet};
use frink_tokenizer::Tokenizer;
use serde_json::{json, Value};

const CONTROL: &[&str] = &[
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|python_tag|>",
    "<|tool_call|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<|tool_call>",
    "<tool_call|>",
    "<|\"|>",
];
/// Rendered as text by frink's vocabulary rules (user-defined tokens).
const USER: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<|channel|>",
    "<|message|>",
    "<|constrain|>",
];

/// GPT-2's printable stand-in for each byte (its byte-level BPE alphabet).
fn byte_chars() -> Vec<String> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1..=0xAC);
    printable.extend(0xAE..=0xFF);
    let mut extra = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable.contains(&b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).unwrap().to_string()
        })
        .collect()
}

/// A byte-level BPE vocabulary: `</s>` (end of generation), the 256 byte symbols, one
/// merge, and the markers.
fn tokenizer() -> Arc<Tokenizer> {
    let mut tokens = vec!["</s>".to_string()];
    let mut types = vec![3i32];
    for c in byte_chars() {
        tokens.push(c);
        types.push(1);
    }
    tokens.push("ab".into());
    types.push(1);
    for m in CONTROL {
        tokens.push(m.to_string());
        types.push(3);
    }
    for m in USER {
        tokens.push(m.to_string());
        types.push(4);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", MetaValue::String("llama".into()))
        .add_metadata("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .add_metadata("tokenizer.ggml.pre", MetaValue::String("gpt-2".into()))
        .add_metadata(
            "tokenizer.ggml.tokens",
            MetaValue::Array(MetaArray::String(tokens)),
        )
        .add_metadata(
            "tokenizer.ggml.token_type",
            MetaValue::Array(MetaArray::I32(types)),
        )
        .add_metadata(
            "tokenizer.ggml.merges",
            MetaValue::Array(MetaArray::String(vec!["a b".into()])),
        )
        .add_metadata("tokenizer.ggml.eos_token_id", MetaValue::U32(0));
    let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
    Arc::new(Tokenizer::from_gguf(&f).unwrap())
}

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}
        },
        "required": ["city"]}}})
}

/// Whether `text`, tokenized with its markers as tokens, is a complete answer under the
/// grammar: every token allowed, and the end of generation allowed after the last.
fn admits(tok: &Arc<Tokenizer>, compiler: &GrammarCompiler, lark: &str, text: &str) -> bool {
    admits_ids(tok, compiler, lark, &tok.encode(text, false, true).unwrap())
}

fn admits_ids(tok: &Arc<Tokenizer>, compiler: &GrammarCompiler, lark: &str, ids: &[u32]) -> bool {
    let c = compiler.compile(&Grammar::Lark(lark.to_string())).unwrap();
    follows(tok, c, ids)
}

/// Whether constraint `c` allows each of `ids` in turn and then the end of generation.
fn follows(tok: &Arc<Tokenizer>, mut c: frink_engine::constraint::Constraint, ids: &[u32]) -> bool {
    let logits = vec![0.0f32; tok.n_vocab()];
    let mut out = Vec::new();
    for &id in ids {
        c.masked(&logits, &mut out).unwrap();
        if out[id as usize] == f32::NEG_INFINITY {
            return false;
        }
        c.commit(id).unwrap();
    }
    c.masked(&logits, &mut out).unwrap();
    out[0].is_finite()
}

/// (format, the call as its model writes it, the same call with arguments that break the
/// schema: `city` missing, or `unit` outside its enum).
fn cases() -> Vec<(ToolFormat, &'static str, &'static str)> {
    use ToolFormat::*;
    vec![
        (
            Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}\n</tool_call>",
        ),
        (
            Qwen3Xml,
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            Llama3Json,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
            "{\"name\": \"get_weather\", \"parameters\": {\"unit\": \"celsius\"}}",
        ),
        (
            MistralJson,
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}, \"id\": \"a1b2c3d4e\"}]",
            "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}, \"id\": \"a1b2c3d4e\"}]",
        ),
        (
            Granite,
            "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}]",
            "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"celsius\"}}]",
        ),
        (
            MistralArgs,
            "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}",
            "[TOOL_CALLS]get_weather[ARGS]{\"unit\": \"celsius\"}",
        ),
        (
            DeepSeekR1,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"unit\": \"celsius\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"unit\": \"celsius\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            DeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"unit\": \"celsius\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"unit\": \"celsius\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            Harmony,
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}",
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"kelvin\"}",
        ),
        (
            Gemma4,
            "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,unit:<|\"|>celsius<|\"|>}<tool_call|>",
            "<|tool_call>call:get_weather{unit:<|\"|>celsius<|\"|>}<tool_call|>",
        ),
    ]
}

/// The case of format `f`.
fn case(f: ToolFormat) -> (ToolFormat, &'static str, &'static str) {
    cases().into_iter().find(|c| c.0 == f).unwrap()
}

#[test]
fn each_format_grammar_admits_its_call_and_refuses_a_bad_one() {
    let tok = tokenizer();
    let compiler = GrammarCompiler::new(Arc::clone(&tok)).unwrap();
    let w = weather();
    let token = |m: &str| tok.control_token(m);
    let tools = ToolSet::new(&[&w]);
    for (f, good, bad) in cases() {
        let lark = f.call_grammar(&[&w], false, &token);
        assert!(
            admits(&tok, &compiler, &lark, good),
            "{f:?} refuses {good:?}\n{lark}"
        );
        assert!(
            !admits(&tok, &compiler, &lark, bad),
            "{f:?} admits {bad:?}\n{lark}"
        );
        // A control-token marker spelled out in text is not the marker.
        let plain = tok.encode(good, false, false).unwrap();
        let has_control = CONTROL.iter().any(|m| good.contains(m));
        assert_eq!(
            admits_ids(&tok, &compiler, &lark, &plain),
            !has_control,
            "{f:?} with its markers as text"
        );
        // Half a call is not an end.
        let half = &good[..good.len() / 2];
        let half = &half[..(0..=half.len())
            .rev()
            .find(|&i| half.is_char_boundary(i))
            .unwrap()];
        assert!(
            !admits(&tok, &compiler, &lark, half),
            "{f:?} ends after {half:?}"
        );
        // What the grammar admits, the parser reads as the call (harmony is read by its
        // channel parser, tested in the server crate).
        if f != ToolFormat::Harmony {
            let (content, calls) = frink_server::tools::parse(f, &tools, good);
            assert_eq!((content.as_str(), calls.len()), ("", 1), "{f:?}");
            assert_eq!(calls[0].name, "get_weather");
        }
    }
    // Parallel calls where the format has them: two calls one after the other.
    let two = [
        (
            ToolFormat::Hermes,
            format!(
                "{}\n{}",
                case(ToolFormat::Hermes).1,
                case(ToolFormat::Hermes).1
            ),
        ),
        (
            ToolFormat::MistralArgs,
            format!(
                "{}{}",
                case(ToolFormat::MistralArgs).1,
                case(ToolFormat::MistralArgs).1
            ),
        ),
        (
            ToolFormat::Gemma4,
            format!(
                "{}{}",
                case(ToolFormat::Gemma4).1,
                case(ToolFormat::Gemma4).1
            ),
        ),
    ];
    for (f, text) in two {
        let lark = f.call_grammar(&[&w], true, &token);
        assert!(
            admits(&tok, &compiler, &lark, &text),
            "{f:?} parallel\n{lark}"
        );
        let one = f.call_grammar(&[&w], false, &token);
        assert!(
            !admits(&tok, &compiler, &one, &text),
            "{f:?} admits two calls without parallel"
        );
    }
    eprintln!("10 formats: each grammar admits its recorded call and refuses a schema violation");
}

/// `tool_choice: "auto"`: the lazy grammar leaves text free and enforces a call once its
/// trigger appears: a trigger token (Mistral's control token), a trigger that is one
/// user-defined token (`<tool_call>`), one spread over several tokens (Llama 3's
/// `{"name"`), and the JSON fallback's shapes at the start of the answer (a fenced or bare
/// call object, which small models write instead of their template's format).
#[test]
fn lazy_grammars_leave_text_free_and_enforce_a_started_call() {
    let tok = tokenizer();
    let compiler = GrammarCompiler::new(Arc::clone(&tok)).unwrap();
    let w = weather();
    let token = |m: &str| tok.control_token(m);
    let fenced =
        |args: &str| format!("```json\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n```");
    let good_args = "{\"city\": \"Paris\"}";
    let bad_args = "{\"unit\": \"celsius\"}";
    use ToolFormat::*;
    for (f, good, bad) in [
        case(Hermes),
        case(Llama3Json),
        case(MistralArgs),
        case(Gemma4),
    ] {
        let lark = f.auto_grammar(&[&w], true, &token);
        let triggers = f.triggers(&token);
        let admits_lazy = |text: &str| {
            let c = compiler
                .compile_lazy(&Grammar::Lark(lark.clone()), triggers.clone())
                .unwrap();
            follows(&tok, c, &tok.encode(text, false, true).unwrap())
        };
        let text = "No call needed: the answer is 42 {\"x\": 1}.";
        assert!(admits_lazy(text), "{f:?}: free text refused");
        assert!(
            admits_lazy(&format!("Let me check. {good}")),
            "{f:?}: call after text refused"
        );
        assert!(
            !admits_lazy(&format!("Let me check. {bad}")),
            "{f:?}: bad call after text admitted"
        );
        if f != ToolFormat::Llama3Json {
            assert!(
                admits_lazy(&fenced(good_args)),
                "{f:?}: fenced call refused"
            );
            assert!(
                !admits_lazy(&fenced(bad_args)),
                "{f:?}: bad fenced call admitted"
            );
            assert!(
                !admits_lazy(&format!(
                    "  {{\"name\": \"get_weather\", \"arguments\": {bad_args}}}"
                )),
                "{f:?}: bad bare call admitted"
            );
            assert!(
                !admits_lazy(&format!(
                    "{{\n  \"name\": \"get_weather\",\n  \"arguments\": {bad_args}}}"
                )),
                "{f:?}: bad spaced-out call admitted"
            );
            assert!(
                admits_lazy(&format!(
                    "{{\n  \"name\": \"get_weather\",\n  \"arguments\": {good_args}}}"
                )),
                "{f:?}: spaced-out call refused"
            );
            // Mid-answer, a fence is text (the fallback reads only a whole answer).
            assert!(admits_lazy(&format!("Try: {}", fenced(bad_args))), "{f:?}");
        }
    }
    eprintln!("lazy grammars: free text admitted, started calls enforced (3 trigger kinds and the fallback shapes)");
}

/// Gemma 4's call grammar follows each argument's schema in the template's syntax: an
/// enum value, an integer, the keys in the order its template writes them (sorted), a
/// string that is the quote-delimited text within its `maxLength`, and nested values in
/// Gemma's own syntax.
#[test]
fn gemma4_arguments_follow_the_schema() {
    let tok = tokenizer();
    let compiler = GrammarCompiler::new(Arc::clone(&tok)).unwrap();
    let token = |m: &str| tok.control_token(m);
    let mut w = weather();
    w["function"]["parameters"]["properties"]["city"]["maxLength"] = json!(20);
    let lark = ToolFormat::Gemma4.call_grammar(&[&w], false, &token);
    let call = |args: &str| format!("<|tool_call>call:get_weather{{{args}}}<tool_call|>");
    let q = |s: &str| s.replace('\'', "<|\"|>");
    for (args, ok) in [
        ("city:'Paris'", true),
        ("city:'Paris, Île-de-France'", true),
        ("city:'Paris, Île-de-France, FR'", false),
        ("city:'Paris',days:3", true),
        ("city:'Paris',days:3.5", false),
        ("city:'Paris',unit:'kelvin'", false),
        ("unit:'celsius',city:'Paris'", false),
        ("city:Paris", false),
        ("", false),
    ] {
        let text = call(&q(args));
        assert_eq!(admits(&tok, &compiler, &lark, &text), ok, "{text}\n{lark}");
    }
    // An object parameter takes any Gemma 4 value; a tool without parameters, `{}`.
    let nested = json!({"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"o": {"type": "object"}}}}});
    let lark = ToolFormat::Gemma4.call_grammar(&[&nested], false, &token);
    for (text, ok) in [
        (
            "<|tool_call>call:f{o:{a:[1,'x',{b:true}],c:null}}<tool_call|>",
            true,
        ),
        ("<|tool_call>call:f{}<tool_call|>", true),
        ("<|tool_call>call:f{o:{a:}}<tool_call|>", false),
    ] {
        assert_eq!(
            admits(&tok, &compiler, &lark, &q(text)),
            ok,
            "{text}\n{lark}"
        );
    }
}
