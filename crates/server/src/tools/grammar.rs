//! The grammars that hold a call to its format and its tool's parameters: a required or
//! named call (`tool_choice`), or, lazily, a call once begun (`auto`); Lark text for
//! llguidance, naming control-token markers by id.

use serde_json::{json, Value};

use super::format::*;

impl ToolFormat {
    /// A Lark grammar (llguidance's syntax) that admits only calls of `tools` (OpenAI
    /// `{"type": "function", "function": {"name", "parameters"}}` objects), each call's
    /// arguments valid against its parameters' schema; one call, or several with
    /// `parallel`. What `tool_choice: "required"` (all tools) or a named function (that
    /// one) compiles to. `token` gives the id of a marker that is one control token of the
    /// vocabulary (named `<[id]>` in the grammar, since its text is not what the model
    /// writes); other markers are literal text.
    pub fn call_grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
    ) -> String {
        self.grammar(tools, parallel, token, false)
    }

    /// The grammar of `tool_choice: "auto"`'s lazy constraint: [`ToolFormat::call_grammar`],
    /// or (formats whose calls are not JSON already) the generic fallback's shapes that
    /// [`ToolFormat::triggers`] start: one call object, bare or in a ```json fence, as
    /// small models write it instead of their template's format.
    pub fn auto_grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
    ) -> String {
        self.grammar(tools, parallel, token, self.json_fallback_triggers())
    }

    /// The grammar of `tool_choice: "auto"` beside a JSON schema (`response_format`): the
    /// answer is either the calls of [`ToolFormat::call_grammar`] or one JSON value of
    /// `schema`, so the model may call a tool or answer in the asked shape.
    pub fn call_or_json_grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
        schema: &Value,
    ) -> String {
        let r = Rules {
            tools,
            parallel,
            token,
        };
        self.grammar(tools, parallel, token, false).replacen(
            "start: native\n",
            &format!("start: native | answer\nanswer: {}\n", r.json_rule(schema)),
            1,
        )
    }

    fn grammar(
        self,
        tools: &[&Value],
        parallel: bool,
        token: &dyn Fn(&str) -> Option<u32>,
        fallback: bool,
    ) -> String {
        let r = Rules {
            tools,
            parallel,
            token,
        };
        let mut g = String::from("%llguidance {}\n");
        if fallback {
            // The fallback reads `arguments` (and `parameters`); one call, as parsed.
            g += &format!(
                "start: native | fallback\nfallback: fbody | \"```json\\n\" fbody \"\\n```\"\nfbody: {}\n",
                r.json_rule(&r.named_objects("arguments", json!({})))
            );
        } else {
            g += "start: native\n";
        }
        g += &match self {
            ToolFormat::Hermes => r.hermes(),
            ToolFormat::Llama3Json => r.llama3_json(),
            ToolFormat::MistralJson => r.json_array(MISTRAL_CALLS, true),
            ToolFormat::Granite => r.json_array(GRANITE_CALL, false),
            ToolFormat::MistralArgs => r.mistral_args(),
            ToolFormat::DeepSeekR1 => r.deepseek(true),
            ToolFormat::DeepSeekV31 => r.deepseek(false),
            ToolFormat::Qwen3Xml => r.qwen3_xml(),
            ToolFormat::Harmony => r.harmony(),
            ToolFormat::Gemma4 => r.gemma4(),
        };
        g
    }
}

/// What every format's grammar is built from: the tools, whether calls may repeat, and
/// the ids of the control-token markers ([`ToolFormat::grammar`]).
struct Rules<'a> {
    tools: &'a [&'a Value],
    parallel: bool,
    token: &'a dyn Fn(&str) -> Option<u32>,
}

impl Rules<'_> {
    /// Marker `m` as a terminal: its token id where it is a control token, else its text.
    fn lit(&self, m: &str) -> String {
        match (self.token)(m) {
            Some(id) => format!("<[{id}]>"),
            None => Value::from(m).to_string(),
        }
    }

    /// Tool `t`'s parameters' schema (any object where it has none).
    fn params(t: &Value) -> Value {
        match t["function"].get("parameters") {
            Some(p) if p.is_object() => p.clone(),
            _ => json!({"type": "object"}),
        }
    }

    /// Tool `t`'s name.
    fn name(t: &Value) -> String {
        t["function"]["name"].as_str().unwrap_or("").to_string()
    }

    /// A Lark rule body holding `schema` (with frink's JSON defaults).
    fn json_rule(&self, schema: &Value) -> String {
        format!(
            "%json {}",
            frink_engine::constraint::json_schema_defaults(schema)
        )
    }

    /// One object schema per tool: `{"name": <const>, key: <its parameters>}` and the
    /// `extra` properties (all required).
    fn named_objects(&self, key: &str, extra: Value) -> Value {
        let alternatives: Vec<Value> = self
            .tools
            .iter()
            .map(|t| {
                let mut props = json!({"name": {"const": Self::name(t)}, key: Self::params(t)});
                let mut required = vec![json!("name"), json!(key)];
                for (k, v) in extra.as_object().into_iter().flatten() {
                    props[k] = v.clone();
                    required.push(json!(k));
                }
                json!({
                    "type": "object",
                    "properties": props,
                    "required": required,
                    "additionalProperties": false
                })
            })
            .collect();
        json!({"anyOf": alternatives})
    }

    /// `native` as one call or, with `parallel`, calls joined by `sep`.
    fn repeated(&self, sep: &str) -> String {
        if self.parallel {
            format!("native: call ({sep} call)*\n")
        } else {
            "native: call\n".to_string()
        }
    }

    /// One rule per tool, `call: c0 | c1 | …`, each built by `one(i, tool)`.
    fn per_tool(&self, one: &dyn Fn(usize, &Value) -> String) -> String {
        let alts: Vec<String> = (0..self.tools.len()).map(|i| format!("c{i}")).collect();
        let mut g = format!("call: {}\n", alts.join(" | "));
        for (i, t) in self.tools.iter().enumerate() {
            g.push_str(&one(i, t));
        }
        g
    }

    fn hermes(&self) -> String {
        self.repeated("\"\\n\"")
            + &format!(
                "call: {} \"\\n\" body \"\\n\" {}\nbody: {}\n",
                self.lit(HERMES_OPEN),
                self.lit(HERMES_CLOSE),
                self.json_rule(&self.named_objects("arguments", json!({})))
            )
    }

    /// One call: the Llama 3 templates teach no parallel calls.
    fn llama3_json(&self) -> String {
        format!(
            "native: body\nbody: {}\n",
            self.json_rule(&self.named_objects("parameters", json!({})))
        )
    }

    /// `marker` then a JSON array of call objects (Mistral, Granite). Mistral (`with_id`):
    /// each call with the 9-character id its templates write into the history (and refuse
    /// other ids), as the model learnt to write it.
    fn json_array(&self, marker: &str, with_id: bool) -> String {
        let extra = if with_id {
            json!({"id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}})
        } else {
            json!({})
        };
        let mut array = json!({"type": "array", "items": self.named_objects("arguments", extra), "minItems": 1});
        if !self.parallel {
            array["maxItems"] = json!(1);
        }
        format!(
            "native: {} body\nbody: {}\n",
            self.lit(marker),
            self.json_rule(&array)
        )
    }

    fn mistral_args(&self) -> String {
        self.repeated("")
            + &self.per_tool(&|i, t| {
                format!(
                    "c{i}: {} {} {} a{i}\na{i}: {}\n",
                    self.lit(MISTRAL_CALLS),
                    Value::from(Self::name(t)),
                    self.lit(MISTRAL_ARGS),
                    self.json_rule(&Self::params(t))
                )
            })
    }

    /// DeepSeek's calls between the calls markers: R1's (`r1`) with `function`, the
    /// separator, the name and a ```json fence, one per line; V3.1's name, separator and
    /// arguments.
    fn deepseek(&self, r1: bool) -> String {
        let sep = if r1 { "\"\\n\"" } else { "" };
        let calls = if self.parallel {
            format!("call ({sep} call)*")
        } else {
            "call".to_string()
        };
        let mut g = format!(
            "native: {} {calls} {}\n",
            self.lit(DS_CALLS_BEGIN),
            self.lit(DS_CALLS_END)
        );
        g += &self.per_tool(&|i, t| {
            let head = if r1 {
                format!(
                    "\"function\" {} {} \"\\n```json\\n\" a{i} \"\\n```\"",
                    self.lit(DS_SEP),
                    Value::from(Self::name(t))
                )
            } else {
                format!("{} {} a{i}", Value::from(Self::name(t)), self.lit(DS_SEP))
            };
            format!(
                "c{i}: {} {head} {}\na{i}: {}\n",
                self.lit(DS_CALL_BEGIN),
                self.lit(DS_CALL_END),
                self.json_rule(&Self::params(t))
            )
        });
        g
    }

    fn qwen3_xml(&self) -> String {
        let mut g = self.repeated("\"\\n\"");
        g += &format!(
            "call: {} \"\\n\" fn \"\\n\" {}\n",
            self.lit(HERMES_OPEN),
            self.lit(HERMES_CLOSE)
        );
        let alts: Vec<String> = (0..self.tools.len()).map(|i| format!("f{i}")).collect();
        g += &format!("fn: {}\n", alts.join(" | "));
        for (i, t) in self.tools.iter().enumerate() {
            g += &xml_function_rules(i, &Self::name(t), &Self::params(t), &|s| self.json_rule(s));
        }
        g
    }

    /// A call right away (gpt-oss asked for a call goes straight to the commentary
    /// channel); the call ends at `<|call|>`, an end-of-generation token.
    fn harmony(&self) -> String {
        "native: call\n".to_string()
            + &self.per_tool(&|i, t| {
                format!(
                "c{i}: {} \"commentary to=functions.\" {} \" \" {} \"json\" {} a{i}\na{i}: {}\n",
                self.lit("<|channel|>"),
                Value::from(Self::name(t)),
                self.lit("<|constrain|>"),
                self.lit("<|message|>"),
                self.json_rule(&Self::params(t))
            )
            })
    }

    /// Calls one after another; each tool's arguments in the key order the template
    /// writes them (`dictsort`), the required ones present.
    fn gemma4(&self) -> String {
        let quote = self.lit(GEMMA4_QUOTE);
        self.repeated("")
            + &gemma4_value_rules(&quote)
            + &self.per_tool(&|i, t| {
                let (args, rules) =
                    gemma4_args_rule(i, &Self::params(t), &quote, &|s| self.json_rule(s));
                format!(
                    "c{i}: {} {} \"{{\" {args} \"}}\" {}\n{rules}",
                    self.lit(GEMMA4_OPEN),
                    Value::from(format!("call:{}", Self::name(t))),
                    self.lit(GEMMA4_CLOSE),
                )
            })
    }
}

/// Lark rules of any Gemma 4 value (`gv`), for arguments whose schema the grammar does
/// not follow (objects, arrays, untyped): strings between `quote` marks holding no `<|`,
/// dicts with bare keys, lists, JSON numbers, `true`, `false`, `null`.
fn gemma4_value_rules(quote: &str) -> String {
    format!(
        "gv: gs | gd | gl | gn | \"true\" | \"false\" | \"null\"\n\
         gs: {quote} /(?:[^<]|<[^|])*/ {quote}\n\
         gd: \"{{\" (gk \":\" gv (\",\" gk \":\" gv)*)? \"}}\"\n\
         gk: /[A-Za-z_][A-Za-z0-9_.-]*/\n\
         gl: \"[\" (gv (\",\" gv)*)? \"]\"\n\
         gn: /-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/\n"
    )
}

/// The Lark expression of tool `i`'s arguments inside `{…}` and its rules: the
/// parameters in the order the template writes them (sorted by name, as its `dictsort`),
/// comma-separated, the required ones present; a string `key:` `quote`d text holding no
/// `<|` (with `minLength`/`maxLength`, no `<` at all, so the bounds count characters
/// exactly; `enum`: one of its values), numbers, integers and booleans as JSON valid
/// against their schema, anything else any Gemma 4 value (`gv`).
fn gemma4_args_rule(
    i: usize,
    params: &Value,
    quote: &str,
    json_rule: &dyn Fn(&Value) -> String,
) -> (String, String) {
    let mut props = schema_properties(params);
    props.sort_by_key(|p| p.0);
    let mut rules = String::new();
    let mut items = Vec::new();
    for (j, &(p, schema, required)) in props.iter().enumerate() {
        let rule = format!("g{i}_{j}");
        let value = match schema["type"].as_str() {
            Some("string") => match schema["enum"].as_array() {
                Some(e) => e
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|v| format!("{quote} {} {quote}", Value::from(v)))
                    .collect::<Vec<_>>()
                    .join(" | "),
                // The schema's length bounds hold on the text between the marks.
                None if schema.get("minLength").is_some() || schema.get("maxLength").is_some() => {
                    format!("{quote} /[^<]{}/ {quote}", length_repeat(schema))
                }
                None => "gs".to_string(),
            },
            Some("number" | "integer" | "boolean" | "null") => {
                rules += &format!("v{i}_{j}: {}\n", json_rule(schema));
                format!("v{i}_{j}")
            }
            _ => "gv".to_string(),
        };
        rules += &format!("{rule}: {} ({value})\n", Value::from(format!("{p}:")));
        items.push((rule, required));
    }
    // seq(j): the items from j on, the first present one without a comma before it.
    fn seq(items: &[(String, bool)], j: usize) -> Option<String> {
        let (rule, req) = items.get(j)?;
        let rest: String = items[j + 1..]
            .iter()
            .map(|(r, q)| {
                if *q {
                    format!(" \",\" {r}")
                } else {
                    format!(" (\",\" {r})?")
                }
            })
            .collect();
        let here = format!("{rule}{rest}");
        Some(if *req {
            here
        } else {
            match seq(items, j + 1) {
                Some(later) => format!("({here} | {later})"),
                None => format!("({here})?"),
            }
        })
    }
    // (With no required item, seq(0) already admits no item at all.)
    (seq(&items, 0).unwrap_or_default(), rules)
}

/// The Lark rules of Qwen3-Coder's `<function=NAME>` block for tool `i`: its parameters in
/// the schema's order (the required ones present, the others optional), a string value
/// raw up to `\n</parameter>` (a value holding `</` cannot be written; `maxLength`
/// and `minLength` bound it, counting a `<` and the character after it as one; `enum`
/// lists its texts), any other value
/// JSON valid against its property schema.
fn xml_function_rules(
    i: usize,
    name: &str,
    params: &Value,
    json_rule: &dyn Fn(&Value) -> String,
) -> String {
    let mut rules = String::new();
    let mut seq = Vec::new();
    for (j, (p, schema, required)) in schema_properties(params).into_iter().enumerate() {
        let rule = format!("p{i}_{j}");
        let open = Value::from(format!("<parameter={p}>\n"));
        let close = "\"\\n</parameter>\\n\"";
        let value = if schema["type"] == "string" {
            match schema["enum"].as_array() {
                Some(e) => e
                    .iter()
                    .filter_map(Value::as_str)
                    .map(|v| format!("{} {close}", Value::from(v)))
                    .collect::<Vec<_>>()
                    .join(" | "),
                // The schema's length bounds hold on the raw text.
                None => format!(
                    r"/(?:[^<]|<[^\/]){}\n<\/parameter>\n/",
                    length_repeat(schema)
                ),
            }
        } else {
            rules += &format!("v{i}_{j}: {}\n", json_rule(schema));
            format!("v{i}_{j} {close}")
        };
        rules += &format!("{rule}: {open} ({value})\n");
        seq.push(if required { rule } else { format!("{rule}?") });
    }
    format!(
        "f{i}: {} {} \"</function>\"\n{rules}",
        Value::from(format!("<function={name}>\n")),
        seq.join(" ")
    )
}

/// The properties of a tool's parameters schema, in the schema's order: each one's name,
/// schema and whether `required` lists it.
fn schema_properties(params: &Value) -> Vec<(&str, &Value, bool)> {
    let required: Vec<&str> = params["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    params["properties"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.as_str(), v, required.contains(&k.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

/// The regex repetition a string schema's `minLength`/`maxLength` allow: `{min,max}`,
/// `{min,}`, or `*` without bounds.
fn length_repeat(schema: &Value) -> String {
    let min = schema["minLength"].as_u64().unwrap_or(0);
    match schema["maxLength"].as_u64() {
        Some(m) => format!("{{{min},{m}}}"),
        None if min == 0 => "*".to_string(),
        None => format!("{{{min},}}"),
    }
}
