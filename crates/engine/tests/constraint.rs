//! Constrained decoding on a real model (smollm2-135m, fetched through the store): the mask
//! changes nothing it need not (a grammar the free answer already satisfies gives the same
//! tokens, greedy and sampled), a schema does change the answer and every constrained
//! answer satisfies it, and what cannot be enforced is refused by name.

use std::sync::Arc;

use frink_engine::constraint::{Grammar, GrammarCompiler};
use frink_engine::sampling::{Sampler, SamplingParams};
use frink_engine::{generate, FinishReason, Flow, GenerateParams, Session};
use frink_models::{KvType, Model};
use frink_tokenizer::{ChatMessage, Tokenizer};

struct Fixture {
    model: Model,
    tok: Arc<Tokenizer>,
    compiler: GrammarCompiler,
}

fn fixture() -> Fixture {
    let store = frink_store::Store::from_env().expect("model store");
    let path = store.pull("smollm2-135m").expect("pull smollm2-135m");
    let model = Model::load(&path).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&model.file).unwrap());
    let compiler = GrammarCompiler::new(Arc::clone(&tok)).unwrap();
    Fixture {
        model,
        tok,
        compiler,
    }
}

impl Fixture {
    fn prompt(&self, user: &str) -> Vec<u32> {
        let p = self
            .tok
            .apply_chat_template(&[ChatMessage::new("user", user)], true)
            .unwrap();
        self.tok.encode_chat(&p).unwrap()
    }

    /// The generated ids and finish reason for `prompt` under `grammar`.
    fn answer(
        &self,
        prompt: &[u32],
        params: &SamplingParams,
        grammar: Option<&Grammar>,
        n: usize,
    ) -> (Vec<u32>, FinishReason) {
        // Plain, then with prompt-lookup speculation: the grammar advances only by the
        // tokens emitted, so both give the same answer.
        let [plain, speculative] = [None, Some(frink_engine::Speculation::default())].map(|spec| {
            let mut session = Session::new(&self.model, 512, KvType::F16);
            let constraint = grammar.map(|g| self.compiler.compile(g).unwrap());
            let mut sampler = Sampler::new(params.clone()).with_constraint(constraint);
            let g = generate(
                &mut session,
                prompt,
                &mut sampler,
                &GenerateParams {
                    ignore_eos: false,
                    max_tokens: n,
                    eog: self.tok.eog_ids().iter().copied().collect(),
                    speculation: spec,
                    ..Default::default()
                },
                |_| Flow::Continue,
            )
            .unwrap();
            (g.ids, g.finish_reason)
        });
        assert_eq!(
            plain, speculative,
            "speculation changed a constrained answer"
        );
        plain
    }

    fn text(&self, ids: &[u32]) -> String {
        self.tok.decode(ids, false).unwrap()
    }
}

/// `text` as a regex that matches exactly it.
fn literal(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
            out.push(c);
        } else if c == '\n' {
            out.push_str("\\n");
        } else {
            out.push(c);
        }
    }
    out
}

/// Issue 13: "the constrained greedy answer equals the unconstrained greedy answer whenever
/// the unconstrained one already satisfies the grammar". Two grammars the free answer
/// satisfies: its own text as a literal regex, and "any text"; greedy, and sampled with a
/// seed (the mask leaves the sampler's candidates as they were).
#[test]
fn a_grammar_the_free_answer_satisfies_changes_nothing() {
    let f = fixture();
    let prompt = f.prompt("Why is the sky blue? Answer in one sentence.");
    let greedy = SamplingParams::greedy();
    let sampled = SamplingParams {
        seed: 11,
        ..SamplingParams::default()
    };
    for params in [&greedy, &sampled] {
        let (free, reason) = f.answer(&prompt, params, None, 48);
        let text = f.text(&free);
        for g in [
            Grammar::Regex(literal(&text)),
            Grammar::Regex("(?s:.*)".into()),
        ] {
            let (got, got_reason) = f.answer(&prompt, params, Some(&g), 48);
            assert_eq!(got, free, "{g:?} changed {text:?} into {:?}", f.text(&got));
            assert_eq!(got_reason, reason);
        }
    }
}

/// A schema changes the answer (smollm2's free answer to this prompt is prose around a
/// fenced JSON block), and the constrained answer is JSON with the schema's required keys,
/// types and enum, ending with `stop`; greedy and three seeds.
#[test]
fn a_schema_changes_the_answer_and_the_answer_satisfies_it() {
    let f = fixture();
    let prompt = f.prompt("Give me a JSON object describing a cat with its name, age and mood.");
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "mood": {"enum": ["happy", "sleepy", "grumpy"]}
        },
        "required": ["name", "age", "mood"],
        "additionalProperties": false
    });
    let g = Grammar::JsonSchema(schema);
    let (free, _) = f.answer(&prompt, &SamplingParams::greedy(), None, 80);
    assert!(
        serde_json::from_str::<serde_json::Value>(&f.text(&free)).is_err(),
        "the free answer is not JSON: {:?}",
        f.text(&free)
    );
    for seed in [None, Some(1), Some(2), Some(3)] {
        let params = match seed {
            None => SamplingParams::greedy(),
            Some(seed) => SamplingParams {
                seed,
                ..SamplingParams::default()
            },
        };
        let (ids, reason) = f.answer(&prompt, &params, Some(&g), 80);
        let text = f.text(&ids);
        assert_eq!(reason, FinishReason::Stop, "seed {seed:?}: {text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{text}");
        assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 20));
        assert!(o["age"].as_i64().is_some_and(|a| (0..=30).contains(&a)));
        assert!(["happy", "sleepy", "grumpy"].contains(&o["mood"].as_str().unwrap()));
    }
}

/// What cannot be enforced is a compile error naming it, never a relaxed constraint.
#[test]
fn unsupported_features_are_refused_by_name() {
    let f = fixture();
    for (schema, name) in [
        (
            serde_json::json!({"type": "array", "uniqueItems": true}),
            "uniqueItems",
        ),
        (serde_json::json!({"not": {"type": "string"}}), "not"),
        (
            serde_json::json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}),
            "if",
        ),
        (
            serde_json::json!({"type": "string", "format": "not-a-format"}),
            "not-a-format",
        ),
    ] {
        let e = f
            .compiler
            .compile(&Grammar::JsonSchema(schema.clone()))
            .unwrap_err();
        assert!(e.0.contains(name), "{schema}: {e}");
    }
    let e = Grammar::from_grammar_text("root ::= \"yes").unwrap_err();
    assert!(e.0.contains("GBNF, line 1: unterminated string"), "{e}");
    assert!(f
        .compiler
        .compile(&Grammar::Lark("start: \"unterminated".into()))
        .is_err());
    assert!(f.compiler.compile(&Grammar::Regex("(".into())).is_err());
}

/// The mask computed ahead (`prepare_constraint`, what the scheduler runs beside the
/// forward pass where a core is free) equals the one computed at sampling: two samplers
/// over the same pseudo-random logits rows, one prepared before every step, pick the same
/// tokens; and the grammar does constrain them (free sampling of these rows differs).
#[test]
fn a_mask_computed_ahead_is_the_mask_computed_at_sampling() {
    let f = fixture();
    let n = f.tok.n_vocab();
    let g = Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 4}},
        "required": ["tags"]
    }));
    let params = SamplingParams {
        seed: 3,
        top_k: 0,
        ..SamplingParams::default()
    };
    let mut ahead =
        Sampler::new(params.clone()).with_constraint(Some(f.compiler.compile(&g).unwrap()));
    let mut late =
        Sampler::new(params.clone()).with_constraint(Some(f.compiler.compile(&g).unwrap()));
    let mut free = Sampler::new(params);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..40 {
        let row: Vec<f32> = (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 40) as f32 / (1u64 << 24) as f32 * 8.0
            })
            .collect();
        ahead.prepare_constraint();
        a.push(ahead.try_sample(&row).unwrap());
        b.push(late.try_sample(&row).unwrap());
        c.push(free.sample(&row));
        if f.tok.is_eog(*a.last().unwrap()) {
            break;
        }
    }
    assert_eq!(a, b);
    assert_ne!(a, c);
    let text = f.text(&a);
    assert!(text.starts_with('{'), "{text:?}");
}

/// Whether `constraint` accepts `text` (as the tokenizer splits it) and then allows the
/// answer to end.
fn accepts(f: &Fixture, grammar: &Grammar, text: &str) -> bool {
    let mut c = f.compiler.compile(grammar).unwrap();
    let n = f.tok.n_vocab();
    let zeros = vec![0.0f32; n];
    let mut row = Vec::new();
    for id in f.tok.encode(text, false, false).unwrap() {
        c.masked(&zeros, &mut row).unwrap();
        if row[id as usize] == f32::NEG_INFINITY {
            return false;
        }
        c.commit(id).unwrap();
    }
    c.masked(&zeros, &mut row).unwrap();
    f.tok.eog_ids().iter().any(|&e| row[e as usize] == 0.0)
}

/// GBNF (llama.cpp's grammar format) is converted, not refused: a JSON grammar, arithmetic
/// and bounded repetitions accept what llama.cpp's grammar sampler accepts and reject what
/// it rejects; a model answer under a GBNF grammar matches it; token references are
/// refused by name.
#[test]
fn gbnf_grammars_constrain_as_llama_cpp_reads_them() {
    let f = fixture();
    let json = r#"
# JSON, as a GBNF grammar
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::=
  "{" ws (
    member ("," ws member)*
  )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws (value ws ("," ws value ws)*)? "]"
string ::= "\"" ([^"\\\x00-\x1f] | "\\" ["\\/bfnrt])* "\""
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws     ::= [ \t\n]*
"#;
    let cases: [(&str, &[&str], &[&str]); 4] = [
        (
            json,
            &[
                r#"{"a": [1, 2.5, true], "b": null}"#,
                "[]",
                r#""x\"y""#,
                "-0.5e+3",
            ],
            &["{a: 1}", "[1,]", "01", r#"{"a" 1}"#],
        ),
        (
            "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+",
            &["12+3-4", "7"],
            &["1++2", "+1", "1+"],
        ),
        (
            "root ::= [a-z]{2,3} \"!\"",
            &["ab!", "abc!"],
            &["a!", "abcd!", "AB!"],
        ),
        (
            "root ::= (\"x\" | \"y\"){,2} \"\\u00e9\" [^a-z]?",
            &["é", "xyé", "é5"],
            &["xxxé", "éa"],
        ),
    ];
    for (gbnf, good, bad) in cases {
        let g = Grammar::from_grammar_text(gbnf).unwrap();
        for t in good {
            assert!(accepts(&f, &g, t), "{gbnf}\nshould accept {t:?}");
        }
        for t in bad {
            assert!(!accepts(&f, &g, t), "{gbnf}\nshould reject {t:?}");
        }
    }
    let g = Grammar::from_grammar_text("root ::= (\"yes\" | \"no\") \".\"").unwrap();
    let prompt = f.prompt("Is the sky blue?");
    let (ids, reason) = f.answer(&prompt, &SamplingParams::greedy(), Some(&g), 20);
    assert!(
        ["yes.", "no."].contains(&f.text(&ids).as_str()),
        "{:?}",
        f.text(&ids)
    );
    assert_eq!(reason, FinishReason::Stop);
    let e = Grammar::from_grammar_text("root ::= <|im_end|>").unwrap_err();
    assert!(e.0.contains("token references"), "{e}");
}

/// A schema that lists its properties without `additionalProperties` (most hand-written and
/// Pydantic schemas) ends: frink closes such objects as llama.cpp does. Before the change
/// a new-user trial of this prompt with this schema (no length bound) saw smollm2 invent
/// keys (`"wind_f"` again and again) until the 4096-token context was full; now: the two
/// keys, then `stop`.
#[test]
fn an_open_schema_with_listed_properties_ends() {
    let f = fixture();
    let prompt = f.prompt("Weather in Paris as JSON");
    let g = Grammar::JsonSchema(serde_json::json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "temp_c": {"type": "number"}},
        "required": ["city", "temp_c"]
    }));
    let (ids, reason) = f.answer(&prompt, &SamplingParams::greedy(), Some(&g), 200);
    assert_eq!(reason, FinishReason::Stop, "{:?}", f.text(&ids));
    let v: serde_json::Value = serde_json::from_str(&f.text(&ids)).unwrap();
    assert_eq!(v.as_object().unwrap().len(), 2, "{v}");
}
