//! Tool calls: which format a model's chat template asks the model to write calls in, the
//! parser that turns its output into OpenAI's `tool_calls` (whole or streamed), and the
//! grammar that enforces a call where `tool_choice` requires one.
//!
//! Formats, each detected from the template text (never the file name) and each read as
//! the template writes an assistant's calls into the history:
//!
//! | format | a call as the model writes it | families |
//! |---|---|---|
//! | `hermes` | `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>` | Qwen2.5, Qwen3, Hermes 2/3 |
//! | `qwen3-xml` | `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>` | Qwen3-Coder |
//! | `llama3-json` | the whole answer `{"name": …, "parameters": {…}}`, after `<\|python_tag\|>` or not | Llama 3.1/3.2/3.3 |
//! | `mistral-json` | `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` | Mistral 7B v0.3, Mixtral, Mistral-Nemo |
//! | `granite` | `<\|tool_call\|>[{"name": …, "arguments": {…}}, …]` | Granite 3.x |
//! | `mistral-args` | `[TOOL_CALLS]f[ARGS]{…}` (a `[CALL_ID]id` before `[ARGS]` is read too) | Mistral-Small 3.2, Magistral, Devstral |
//! | `deepseek-r1` | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` | DeepSeek-R1 and its distills, DeepSeek-V3 |
//! | `deepseek-v3.1` | `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>` | DeepSeek-V3.1 |
//! | `harmony` | `<\|channel\|>commentary to=functions.f <\|constrain\|>json<\|message\|>{…}` ending at `<\|call\|>` | gpt-oss (parsed with its channels in [`crate::harmony`]) |
//! | `gemma4` | `<\|tool_call>call:f{city:<\|"\|>Paris<\|"\|>,days:3}<tool_call\|>` (bare keys, strings between `<\|"\|>` marks) | Gemma 4 |
//!
//! Markers that are control tokens of the vocabulary (`[TOOL_CALLS]`, `[ARGS]`,
//! `<|python_tag|>`, …) render as text for requests with tools ([`ToolFormat::markers`],
//! llama-server's "preserved tokens"), and grammars name them by token id. Every format also
//! takes the generic JSON fallback: an answer that is as a whole a call object (or an array
//! of them) naming one of the tools. A template without a known format makes a request with
//! tools a 400 naming the reason, rather than an answer whose calls are left in the text.

mod format;
mod grammar;
mod parse;
mod request;
mod stream;

pub use crate::calls::{call_from, Item, ToolCall, ToolSet};
pub use format::ToolFormat;
pub use parse::gemma4_value;
pub use request::{
    call_json, check_tools, choice, gemma4_tool_responses, history_call, message_extra,
    wants_tool_responses,
};
pub use stream::{parse, StreamParser};

#[cfg(test)]
mod tests {
    use super::*;
    use format::GEMMA4_QUOTE;
    use frink_tokenizer::ChatMessage;
    use serde_json::{json, Value};

    use stream::gather;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"]}}})
    }

    fn tool_set() -> ToolSet {
        let x = json!({"type": "function", "function": {"name": "x", "parameters": {"type": "object"}}});
        ToolSet::new(&[&weather(), &x])
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Recorded outputs of every format, each as its model writes calls (the shapes its
    /// template writes into the history, see tests/data/templates/reference.json): text
    /// before a call, two calls, a malformed body (content as written, never an error).
    /// Each case: (format, output, expected content, expected calls).
    fn cases() -> Vec<(ToolFormat, &'static str, &'static str, Vec<ToolCall>)> {
        let paris = || call("get_weather", r#"{"city":"Paris"}"#);
        let two = || {
            vec![
                call("get_weather", r#"{"city":"Paris","days":2}"#),
                call("x", "{}"),
            ]
        };
        use ToolFormat::*;
        vec![
            (Hermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "Let me check.", vec![paris()]),
            (Hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"x\", \"arguments\": \"{}\"}\n</tool_call>", "", two()),
            (Hermes, "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call> done", "<tool_call>\n{\"name\": \"a\", \"arguments\": {\n</tool_call> done", vec![]),
            (Qwen3Xml, "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>", "I will look.", vec![paris()]),
            (Qwen3Xml, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=x>\n</function>\n</tool_call>", "", two()),
            (Qwen3Xml, "<tool_call>\n<function=get_weather\n</tool_call>", "<tool_call>\n<function=get_weather\n</tool_call>", vec![]),
            (Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", vec![paris()]),
            (Llama3Json, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", vec![paris()]),
            (Llama3Json, "{\"name\": \"get_weather\", \"parameters\": {", "{\"name\": \"get_weather\", \"parameters\": {", vec![]),
            (MistralJson, "Sure.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1b2c3d4e\"}]", "Sure.", vec![paris()]),
            (MistralJson, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}, {\"name\": \"x\", \"arguments\": {}}]", "", two()),
            // A call cut short (max_tokens) is dropped, not shown as content.
            (MistralJson, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\"", "", vec![]),
            (Hermes, "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\n  \"name\": \"", "Sure.", vec![paris()]),
            (Granite, "Checking.<|tool_call|>[{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}]", "Checking.", vec![paris()]),
            (Granite, "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}, {\"name\": \"x\", \"arguments\": {}}]", "", two()),
            (Granite, "<|tool_call|>[{\"name\": 3}]", "<|tool_call|>[{\"name\": 3}]", vec![]),
            (MistralArgs, "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "Checking.", vec![paris()]),
            (MistralArgs, "[TOOL_CALLS]get_weather[CALL_ID]call_0001[ARGS]{\"city\": \"Paris\", \"days\": 2}[TOOL_CALLS]x[ARGS]{}", "", two()),
            (MistralArgs, "[TOOL_CALLS]get_weather{\"city\": 1}", "[TOOL_CALLS]get_weather{\"city\": 1}", vec![]),
            (DeepSeekR1, "Looking it up.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "Looking it up.", vec![paris()]),
            (DeepSeekR1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\", \"days\": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>x\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", two()),
            (DeepSeekR1, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\n```<｜tool▁call▁end｜>", vec![]),
            (DeepSeekV31, "On it.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "On it.", vec![paris()]),
            (DeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "", two()),
            (DeepSeekV31, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{<｜tool▁call▁end｜>", vec![]),
            // Gemma 4: as its template writes a call into the history.
            (Gemma4, "Let me check.<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>", "Let me check.", vec![paris()]),
            (Gemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|><|tool_call>call:x{}<tool_call|>", "", two()),
            (Gemma4, "<|tool_call>call:get_weather{city:Paris}<tool_call|>", "<|tool_call>call:get_weather{city:Paris}<tool_call|>", vec![]),
        ]
    }

    /// An OpenAI tool-calling history (a call, its `tool` result) converted for the earlier
    /// Gemma 4 template renders exactly as transformers renders Gemma's own form (the call
    /// with `tool_responses`) through that template (frink-tokenizer's reference.json,
    /// case `tool_responses`), where unconverted it would give the result a `tool` turn
    /// the model never saw; the current template is left to read `tool` messages itself.
    #[test]
    fn tool_results_become_gemma4_tool_responses() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tokenizer/tests/data/templates/"
        );
        let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
        let reference: Value = serde_json::from_str(&read("reference.json")).unwrap();
        let case = |name: &str| {
            reference["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap()
                .clone()
        };
        let message = |v: &Value| {
            let mut extra = v.as_object().unwrap().clone();
            let role = extra.remove("role").unwrap().as_str().unwrap().to_string();
            let content = extra
                .remove("content")
                .unwrap()
                .as_str()
                .unwrap()
                .to_string();
            ChatMessage {
                role,
                content,
                extra,
            }
        };
        let openai = case("tool_call_and_result");
        let messages: Vec<ChatMessage> = openai["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(message)
            .collect();
        let older = "google-gemma-4-31B-it-interleaved.jinja";
        let wants = |f: &str| wants_tool_responses(ToolFormat::detect(&read(f)), &read(f));
        assert!(wants(older));
        assert!(!wants("google-gemma-4-31B-it.jinja"));
        assert!(!wants("Qwen-Qwen3-0.6B.jinja"));
        let converted = gemma4_tool_responses(messages.clone());
        assert_eq!(converted.len(), 2);
        assert_eq!(
            converted[1].extra["tool_responses"],
            json!([{"name": "get_weather", "response": {"temperature": 21}}])
        );
        let inputs = frink_tokenizer::TemplateInputs {
            add_generation_prompt: true,
            tools: openai.get("tools").cloned(),
            ..Default::default()
        };
        let render = |m: &[ChatMessage]| {
            frink_tokenizer::render_template(&read(older), m, &inputs, "<s>", "</s>").unwrap()
        };
        let want = reference["renderings"][older]["tool_responses"]["text"]
            .as_str()
            .unwrap();
        assert_eq!(render(&converted), want);
        assert_ne!(render(&messages), want);
        // The answer after the results joins the turn; other histories pass unchanged.
        let mut with_answer = messages.clone();
        with_answer.push(ChatMessage::new("assistant", "21 degrees."));
        with_answer.push(ChatMessage::new("user", "Thanks."));
        let c = gemma4_tool_responses(with_answer);
        assert_eq!(
            (c.len(), c[1].content.as_str(), c[2].role.as_str()),
            (3, "21 degrees.", "user")
        );
        let plain = vec![
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "hello"),
        ];
        assert_eq!(gemma4_tool_responses(plain.clone()), plain);
    }

    /// Gemma 4's argument syntax as its template's `format_argument` writes each kind of
    /// value (nested dicts with bare or quoted keys, lists, numbers, booleans, null, a
    /// string holding JSON punctuation), and texts that are not one.
    #[test]
    fn gemma4_values_read_as_json() {
        let q = |s: &str| s.replace('\'', GEMMA4_QUOTE);
        let text = q("{a:'x, {y}: z',b:[1,-2.5e3,true,null],c:{'d e':false,f:[]},g:{}}");
        let (v, rest) = gemma4_value(&text).unwrap();
        assert_eq!(
            v,
            json!({"a": "x, {y}: z", "b": [1, -2500.0, true, null], "c": {"d e": false, "f": []}, "g": {}})
        );
        assert_eq!(rest, "");
        let (v, rest) = gemma4_value(" 12 }").unwrap();
        assert_eq!((v, rest), (json!(12), "}"));
        for bad in [
            "{a:Paris}",
            "{a:1",
            "{:1}",
            "[1,]",
            &q("{a:'x}"),
            "\"json\"",
        ] {
            assert!(gemma4_value(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn recorded_outputs_of_every_format_parse_into_content_and_calls() {
        let tools = tool_set();
        for (f, text, content, calls) in cases() {
            assert_eq!(
                parse(f, &tools, text),
                (content.to_string(), calls),
                "{f:?}: {text:?}"
            );
        }
        // An unterminated Hermes call counts if its body is a call; text that may start a
        // tag is content at the end.
        let (_, calls) = parse(
            ToolFormat::Hermes,
            &tools,
            "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"k\": 2}}",
        );
        assert_eq!(calls.len(), 1);
        assert_eq!(
            parse(ToolFormat::Hermes, &tools, "no calls <tool"),
            ("no calls <tool".to_string(), vec![])
        );
    }

    /// Split at every character boundary, the stream gives the whole parse.
    #[test]
    fn streaming_at_every_boundary_gives_the_whole_parse() {
        let tools = tool_set();
        for (f, text, _, _) in cases() {
            let whole = parse(f, &tools, text);
            for cut in 1..text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut p = StreamParser::new(f, tools.clone());
                let mut items = p.push(&text[..cut]);
                items.extend(p.push(&text[cut..]));
                items.extend(p.finish());
                let (mut content, calls) = gather(items);
                if !calls.is_empty() {
                    content = content.trim().to_string();
                }
                assert_eq!((content, calls), whole, "{f:?} cut at {cut}");
            }
        }
    }

    /// Each format is detected from its family's real template (tests/data/templates,
    /// the files llama.cpp and the model authors publish).
    #[test]
    fn formats_are_detected_from_the_real_templates() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tokenizer/tests/data/templates/"
        );
        let expect = [
            ("Qwen-Qwen2.5-7B-Instruct.jinja", Some(ToolFormat::Hermes)),
            ("Qwen-Qwen3-0.6B.jinja", Some(ToolFormat::Hermes)),
            (
                "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
                Some(ToolFormat::Hermes),
            ),
            ("HuggingFaceTB-SmolLM3-3B.jinja", None),
            ("catalog-qwen2.5-coder-0.5b.jinja", Some(ToolFormat::Hermes)),
            ("Qwen3-Coder.jinja", Some(ToolFormat::Qwen3Xml)),
            (
                "meta-llama-Llama-3.1-8B-Instruct.jinja",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "meta-llama-Llama-3.2-3B-Instruct.jinja",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "meta-llama-Llama-3.3-70B-Instruct.jinja",
                Some(ToolFormat::Llama3Json),
            ),
            (
                "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                Some(ToolFormat::MistralJson),
            ),
            (
                "Mistral-Small-3.2-24B-Instruct-2506.jinja",
                Some(ToolFormat::MistralArgs),
            ),
            (
                "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                Some(ToolFormat::DeepSeekR1),
            ),
            (
                "deepseek-ai-DeepSeek-V3.1.jinja",
                Some(ToolFormat::DeepSeekV31),
            ),
            ("openai-gpt-oss-120b.jinja", Some(ToolFormat::Harmony)),
            ("catalog-smollm2-135m.jinja", None),
            ("google-gemma-2-2b-it.jinja", None),
            (
                "ibm-granite-granite-3.3-2B-Instruct.jinja",
                Some(ToolFormat::Granite),
            ),
            ("google-gemma-4-31B-it.jinja", Some(ToolFormat::Gemma4)),
            (
                "google-gemma-4-31B-it-interleaved.jinja",
                Some(ToolFormat::Gemma4),
            ),
            ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", None),
            ("microsoft-Phi-3.5-mini-instruct.jinja", None),
        ];
        for (file, want) in expect {
            let t = std::fs::read_to_string(format!("{dir}{file}")).unwrap();
            assert_eq!(ToolFormat::detect(&t), want, "{file}");
        }
    }

    /// Llama 3.x's grammar takes the parameters under that key; a marker that is a control
    /// token is named by id, other markers are text.
    #[test]
    fn grammars_use_the_format_keys_and_token_ids() {
        let w = weather();
        let g = ToolFormat::Llama3Json.call_grammar(&[&w], true, &|_| None);
        assert!(
            g.contains("\"parameters\"") && !g.contains("tool_call"),
            "{g}"
        );
        let g =
            ToolFormat::MistralArgs.call_grammar(&[&w], true, &|m| (m == "[ARGS]").then_some(7));
        assert!(g.contains("<[7]>") && g.contains("\"[TOOL_CALLS]\""), "{g}");
    }

    #[test]
    fn tool_choice_selects_and_requires() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "a"}}),
            json!({"type": "function", "function": {"name": "b"}}),
        ];
        assert_eq!(choice(&tools, None).unwrap().0.len(), 2);
        assert!(!choice(&tools, Some(&json!("auto"))).unwrap().1);
        assert!(choice(&tools, Some(&json!("none"))).unwrap().0.is_empty());
        assert!(choice(&tools, Some(&json!("required"))).unwrap().1);
        let (t, req) = choice(
            &tools,
            Some(&json!({"type": "function", "function": {"name": "b"}})),
        )
        .unwrap();
        assert!(req && t.len() == 1 && t[0]["function"]["name"] == "b");
        assert!(choice(
            &tools,
            Some(&json!({"type": "function", "function": {"name": "c"}}))
        )
        .is_err());
        assert!(choice(&tools, Some(&json!("maybe"))).is_err());
    }
}
