//! The little JSON the shim needs, by hand: a strict reader of a document's top-level object
//! members (strings and integers; other values are validated and skipped) and a string
//! encoder. Anything it does not accept makes the shim hand the call to `plexus`, which parses
//! with serde_json, so a disagreement costs time, never a wrong answer.

/// A top-level member's value, as far as the shim cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A string, unescaped.
    Str(String),
    /// An integer that fits an `i64`.
    Int(i64),
    /// Anything else (object, array, bool, null, other numbers).
    Other,
}

/// serde_json's default nesting limit.
const MAX_DEPTH: usize = 128;

/// The members of the top-level object of `doc`, in order (duplicates kept); `None` when `doc`
/// is not exactly one valid JSON object (surrounding whitespace allowed).
pub fn object_members(doc: &[u8]) -> Option<Vec<(String, Value)>> {
    let mut p = Parser { s: doc, i: 0 };
    p.ws();
    if p.peek()? != b'{' {
        return None;
    }
    let members = p.object(0, true)?;
    p.ws();
    (p.i == doc.len()).then_some(members)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.bump()? == c).then_some(())
    }

    /// An object at `self.i`; its members are collected only when `keep`.
    fn object(&mut self, depth: usize, keep: bool) -> Option<Vec<(String, Value)>> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        let mut out = Vec::new();
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(out);
        }
        loop {
            self.ws();
            let k = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let v = self.value(depth + 1)?;
            if keep {
                out.push((k, v));
            }
            self.ws();
            match self.bump()? {
                b',' => continue,
                b'}' => return Some(out),
                _ => return None,
            }
        }
    }

    fn array(&mut self, depth: usize) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            self.value(depth + 1)?;
            self.ws();
            match self.bump()? {
                b',' => continue,
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        match self.peek()? {
            b'"' => self.string().map(Value::Str),
            b'{' => self.object(depth, false).map(|_| Value::Other),
            b'[' => self.array(depth).map(|_| Value::Other),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.number(),
        }
    }

    fn word(&mut self, w: &[u8]) -> Option<Value> {
        let end = self.i.checked_add(w.len())?;
        (self.s.get(self.i..end)? == w).then(|| {
            self.i = end;
            Value::Other
        })
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Option<Value> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let int_start = self.i;
        let n = self.digits();
        if n == 0 || (n > 1 && self.s[int_start] == b'0') {
            return None;
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            self.i += 1;
            integer = false;
            if self.digits() == 0 {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            integer = false;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return None;
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.i]).ok()?;
        Some(match text.parse::<i64>() {
            Ok(v) if integer => Value::Int(v),
            _ => Value::Other,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let end = self.i.checked_add(4)?;
        let h = std::str::from_utf8(self.s.get(self.i..end)?).ok()?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        self.i = end;
        u32::from_str_radix(h, 16).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            // Copy the run up to the next quote, backslash or control character at once.
            let start = self.i;
            while matches!(self.peek(), Some(c) if c != b'"' && c != b'\\' && c >= 0x20) {
                self.i += 1;
            }
            out.extend_from_slice(&self.s[start..self.i]);
            match self.bump()? {
                b'"' => return String::from_utf8(out).ok(),
                b'\\' => {
                    let c = match self.bump()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.escaped_char()?,
                        _ => return None,
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
                _ => return None, // a raw control character
            }
        }
    }

    /// The character of a `\uXXXX` escape (the `\u` read), joining a surrogate pair.
    fn escaped_char(&mut self) -> Option<char> {
        let hi = self.hex4()?;
        if (0xD800..0xDC00).contains(&hi) {
            self.eat(b'\\')?;
            self.eat(b'u')?;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return None;
            }
            return char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00));
        }
        char::from_u32(hi)
    }
}

/// Append `s` to `out` as a JSON string (quotes included).
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(s: &str) -> Option<Vec<(String, Value)>> {
        object_members(s.as_bytes())
    }

    #[test]
    fn reads_top_level_members_and_skips_nested_values() {
        let m = members(
            r#" {"a":"x\"y\\z\u00e9\ud83d\ude00\n","n":-12,"f":1.5e3,"o":{"daemonSocket":"no"},
                "l":[1,[true,false,null],{}],"e":"" } "#,
        )
        .unwrap();
        let keys: Vec<&str> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "n", "f", "o", "l", "e"]);
        assert_eq!(m[0].1, Value::Str("x\"y\\zé😀\n".into()));
        assert_eq!(m[1].1, Value::Int(-12));
        assert_eq!(m[2].1, Value::Other);
        assert_eq!(m[3].1, Value::Other);
        assert_eq!(m[5].1, Value::Str(String::new()));
    }

    #[test]
    fn rejects_what_serde_json_rejects() {
        for bad in [
            "",
            "[]",
            "\"s\"",
            "{",
            "{}x",
            "{} {}",
            r#"{"a":}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{'a':1}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":.5}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":"\x"}"#,
            r#"{"a":"\ud800"}"#,
            r#"{"a":"\ud800\u0041"}"#,
            "{\"a\":\"tab\there\"}",
            r#"{"a":[1,]}"#,
        ] {
            assert_eq!(members(bad), None, "{bad:?}");
        }
        assert_eq!(object_members(b"{\"a\":\"\xff\"}"), None);
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(members(&deep), None);
        let ok = format!("{{\"a\":{}{}}}", "[".repeat(100), "]".repeat(100));
        assert!(members(&ok).is_some());
    }

    #[test]
    fn strings_round_trip_through_the_encoder() {
        let s = "q\" b\\ nl\n cr\r tab\t bell\u{7} nul\u{0} é 😀 /";
        let mut doc = String::from("{\"k\":");
        push_str(&mut doc, s);
        doc.push('}');
        assert_eq!(members(&doc).unwrap()[0].1, Value::Str(s.into()));
    }
}
