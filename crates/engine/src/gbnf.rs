//! GBNF (llama.cpp's grammar format, `grammars/README.md` there) to `llguidance`'s Lark
//! syntax, so `grammar` fields and `--grammar` files written for llama.cpp constrain frink's
//! answers the same way. The `llguidance` crate has no such converter; this is frink's.
//!
//! The GBNF read here, as llama.cpp's `llama_grammar_parser` reads it
//! (src/llama-grammar.cpp): rules `name ::= alternatives`; alternatives separated by `|`;
//! sequences of string literals (`"…"` with the escapes `\n \r \t \\ \" \[ \] \xHH \uHHHH
//! \UHHHHHHHH`), character classes (`[a-z0-9_]`, negated `[^…]`, with the same escapes),
//! `.` (any character), rule references and parenthesised groups, each optionally followed
//! by `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`, `{,n}`; `#` comments. A rule ends at the end
//! of its line except inside parentheses or right after `::=` or `|`. The start rule is
//! `root`. Token references (`<[123]>`, `<|name|>`, `!<…>`) are refused by name.
//!
//! Each GBNF rule becomes a Lark rule (lower-case, `g_` prefix), literals JSON strings,
//! classes and `.` regexes written with `\x{…}` escapes; `start: g_root`.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::constraint::GrammarError;

/// Converts a GBNF grammar to `llguidance`'s Lark syntax.
///
/// Errors: a syntax error (with its line), an undefined rule, no `root` rule, a token
/// reference (unsupported), a repetition `{0}` / `{m,n}` with `n < m`.
pub fn gbnf_to_lark(src: &str) -> Result<String, GrammarError> {
    let mut p = Parser {
        s: src.as_bytes(),
        src,
        pos: 0,
        names: HashMap::new(),
        defined: Vec::new(),
        rules: Vec::new(),
    };
    p.grammar()?;
    if !p.defined.iter().any(|n| n == "root") {
        return Err(GrammarError("GBNF: the grammar has no `root` rule".into()));
    }
    for name in p.names.keys() {
        if !p.defined.contains(name) {
            return Err(GrammarError(format!(
                "GBNF: rule `{name}` is used but not defined"
            )));
        }
    }
    let mut out = format!("start: {}\n", p.names["root"]);
    for (name, body) in &p.rules {
        let _ = writeln!(out, "{name}: {body}");
    }
    Ok(out)
}

struct Parser<'a> {
    s: &'a [u8],
    src: &'a str,
    pos: usize,
    /// GBNF rule name -> Lark rule name.
    names: HashMap<String, String>,
    /// GBNF rules defined so far (a rule may be given twice: its alternatives add up).
    defined: Vec<String>,
    /// Lark rules in definition order: (name, body).
    rules: Vec<(String, String)>,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> GrammarError {
        let line = self.src[..self.pos.min(self.src.len())]
            .matches('\n')
            .count()
            + 1;
        GrammarError(format!("GBNF, line {line}: {what}"))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.pos).copied()
    }

    /// Skips spaces, tabs and comments, and newlines too when `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' => self.pos += 1,
                b'\r' | b'\n' if newlines => self.pos += 1,
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.pos += 1;
                    }
                }
                _ => break,
            }
        }
    }

    fn lark_name(&mut self, gbnf: &str) -> String {
        if let Some(n) = self.names.get(gbnf) {
            return n.clone();
        }
        let base = format!("g_{}", gbnf.to_ascii_lowercase());
        let mut name = base.clone();
        let mut k = 1;
        while self.names.values().any(|v| *v == name) {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.names.insert(gbnf.to_string(), name.clone());
        name
    }

    fn name(&mut self) -> Option<String> {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            self.pos += 1;
        }
        (self.pos > start).then(|| self.src[start..self.pos].to_string())
    }

    fn grammar(&mut self) -> Result<(), GrammarError> {
        loop {
            self.space(true);
            if self.peek().is_none() {
                return Ok(());
            }
            let name = self
                .name()
                .ok_or_else(|| self.err("expected a rule name"))?;
            self.space(false);
            if !self.src[self.pos..].starts_with("::=") {
                return Err(self.err(&format!("expected `::=` after `{name}`")));
            }
            self.pos += 3;
            self.space(true);
            let body = self.alternates(false)?;
            let lark = self.lark_name(&name);
            match self.rules.iter_mut().find(|(n, _)| *n == lark) {
                Some((_, b)) => *b = format!("{b} | {body}"),
                None => self.rules.push((lark, body)),
            }
            self.defined.push(name);
            match self.peek() {
                None | Some(b'\n' | b'\r') => {}
                Some(c) => return Err(self.err(&format!("unexpected `{}`", c as char))),
            }
        }
    }

    fn alternates(&mut self, nested: bool) -> Result<String, GrammarError> {
        let mut alts = vec![self.sequence(nested)?];
        while self.peek() == Some(b'|') {
            self.pos += 1;
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
        Ok(alts.join(" | "))
    }

    fn sequence(&mut self, nested: bool) -> Result<String, GrammarError> {
        let mut items: Vec<String> = Vec::new();
        while let Some(atom) = self.atom()? {
            let item = self.postfix(atom)?;
            if let Some(item) = item {
                items.push(item);
            }
            self.space(nested);
        }
        Ok(if items.is_empty() {
            "\"\"".to_string()
        } else {
            items.join(" ")
        })
    }

    /// One atom as Lark, or `None` at the end of a sequence.
    fn atom(&mut self) -> Result<Option<String>, GrammarError> {
        let Some(c) = self.peek() else {
            return Ok(None);
        };
        Ok(Some(match c {
            b'"' => {
                self.pos += 1;
                let mut text = String::new();
                loop {
                    match self.peek() {
                        None | Some(b'\n') => return Err(self.err("unterminated string")),
                        Some(b'"') => {
                            self.pos += 1;
                            break;
                        }
                        _ => text.push(self.char()?),
                    }
                }
                if text.is_empty() {
                    "\"\"".to_string()
                } else {
                    serde_json::to_string(&text).expect("a string serializes")
                }
            }
            b'[' => {
                self.pos += 1;
                let mut class = String::from("[");
                if self.peek() == Some(b'^') {
                    self.pos += 1;
                    class.push('^');
                }
                let mut any = false;
                loop {
                    match self.peek() {
                        None => return Err(self.err("unterminated character class")),
                        Some(b']') if any => {
                            self.pos += 1;
                            break;
                        }
                        _ => {
                            let lo = self.char()?;
                            let _ = write!(class, "\\x{{{:x}}}", lo as u32);
                            if self.peek() == Some(b'-') && self.s.get(self.pos + 1) != Some(&b']')
                            {
                                self.pos += 1;
                                let hi = self.char()?;
                                if hi < lo {
                                    return Err(self.err("a character range ends below its start"));
                                }
                                let _ = write!(class, "-\\x{{{:x}}}", hi as u32);
                            }
                            any = true;
                        }
                    }
                }
                class.push(']');
                format!("/{class}/")
            }
            b'.' => {
                self.pos += 1;
                "/(?s:.)/".to_string()
            }
            b'(' => {
                self.pos += 1;
                self.space(true);
                let inner = self.alternates(true)?;
                if self.peek() != Some(b')') {
                    return Err(self.err("expected `)`"));
                }
                self.pos += 1;
                format!("({inner})")
            }
            b'<' | b'!' => {
                return Err(
                    self.err("token references (`<[id]>`, `<|name|>`, `!<…>`) are not supported")
                )
            }
            c if c.is_ascii_alphanumeric() || c == b'-' || c == b'_' => {
                let name = self.name().expect("a name character");
                self.lark_name(&name)
            }
            _ => return Ok(None),
        }))
    }

    /// The atom with its repetition, or `None` for `{0}`.
    fn postfix(&mut self, atom: String) -> Result<Option<String>, GrammarError> {
        match self.peek() {
            Some(op @ (b'*' | b'+' | b'?')) => {
                self.pos += 1;
                Ok(Some(format!("{atom}{}", op as char)))
            }
            Some(b'{') => {
                self.pos += 1;
                self.space(false);
                let min = self.number()?;
                self.space(false);
                let max = if self.peek() == Some(b',') {
                    self.pos += 1;
                    self.space(false);
                    if self.peek() == Some(b'}') {
                        None
                    } else {
                        Some(
                            self.number()?
                                .ok_or_else(|| self.err("expected a number"))?,
                        )
                    }
                } else {
                    Some(min.ok_or_else(|| self.err("expected a number"))?)
                };
                self.space(false);
                if self.peek() != Some(b'}') {
                    return Err(self.err("expected `}`"));
                }
                self.pos += 1;
                let min = min.unwrap_or(0);
                match max {
                    Some(0) => Ok(None),
                    Some(max) if max < min => {
                        Err(self.err("a repetition's maximum is below its minimum"))
                    }
                    Some(max) if min == max => Ok(Some(format!("{atom}{{{min}}}"))),
                    Some(max) => Ok(Some(format!("{atom}{{{min},{max}}}"))),
                    None => Ok(Some(format!("{atom}{{{min},}}"))),
                }
            }
            _ => Ok(Some(atom)),
        }
    }

    fn number(&mut self) -> Result<Option<u32>, GrammarError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if self.pos == start {
            return Ok(None);
        }
        self.src[start..self.pos]
            .parse()
            .map(Some)
            .map_err(|_| self.err("a repetition count is too large"))
    }

    /// One character of a literal or class, escapes decoded.
    fn char(&mut self) -> Result<char, GrammarError> {
        let rest = &self.src[self.pos..];
        let c = rest
            .chars()
            .next()
            .ok_or_else(|| self.err("unexpected end"))?;
        if c != '\\' {
            self.pos += c.len_utf8();
            return Ok(c);
        }
        let e = rest[1..]
            .chars()
            .next()
            .ok_or_else(|| self.err("unterminated escape"))?;
        self.pos += 1 + e.len_utf8();
        let hex = |p: &mut Self, n: usize| -> Result<char, GrammarError> {
            let digits = p
                .src
                .get(p.pos..p.pos + n)
                .ok_or_else(|| p.err("short escape"))?;
            let v = u32::from_str_radix(digits, 16).map_err(|_| p.err("bad hex escape"))?;
            p.pos += n;
            char::from_u32(v).ok_or_else(|| p.err("escape is not a character"))
        };
        match e {
            'n' => Ok('\n'),
            'r' => Ok('\r'),
            't' => Ok('\t'),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            other => Err(self.err(&format!("unknown escape `\\{other}`"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn rules_literals_classes_and_repetitions_convert() {
        let lark = gbnf_to_lark(
            "root ::= \"a\\n\" item{2,3} (x | \"q\")* # comment\nitem ::= [a-c^] | [^\\]]\nx ::= .?",
        )
        .unwrap();
        assert_eq!(
            lark,
            "start: g_root\n\
             g_root: \"a\\n\" g_item{2,3} (g_x | \"q\")*\n\
             g_item: /[\\x{61}-\\x{63}\\x{5e}]/ | /[^\\x{5d}]/\n\
             g_x: /(?s:.)/?\n"
        );
    }

    #[test]
    fn errors_name_what_is_wrong() {
        for (src, what) in [
            ("item ::= \"a\"", "no `root`"),
            ("root ::= other", "`other` is used but not defined"),
            ("root ::= \"abc", "unterminated string"),
            ("root ::= <|im_end|>", "token references"),
            ("root ::= \"a\"{3,2}", "maximum is below"),
            ("root = \"a\"", "expected `::=`"),
            ("root ::= [z-a]", "ends below its start"),
        ] {
            let e = gbnf_to_lark(src).unwrap_err();
            assert!(e.0.contains(what), "{src}: {e}");
        }
    }
}
