//! The canonicaliser's tests, and its differential tests against serde_json.

use super::*;

fn canon(s: &str) -> Option<String> {
    canonicalize(s.as_bytes()).map(|v| String::from_utf8(v).unwrap())
}

#[test]
fn sorts_keys_and_drops_white_space() {
    assert_eq!(
        canon(" { \"b\" : [1, 2 ,{\"z\":null,\"a\":true}], \"a\": \"x\" } ").as_deref(),
        Some(r#"{"a":"x","b":[1,2,{"a":true,"z":null}]}"#)
    );
}

#[test]
fn keeps_number_literals_exactly() {
    assert_eq!(
        canon("[12345678901234567890123, 12345678901234567890124, 1.0, 1, -0, 1e3]").as_deref(),
        Some("[12345678901234567890123,12345678901234567890124,1.0,1,-0,1e3]")
    );
}

#[test]
fn normalises_string_escapes() {
    assert_eq!(
        canon(r#""\u0041\/\n\u00e9""#).as_deref(),
        Some("\"A/\\né\"")
    );
    assert_eq!(canon(r#""\ud83d\ude00""#).as_deref(), Some("\"😀\""));
}

#[test]
fn refuses_what_it_cannot_canonicalise_safely() {
    for bad in [
        r#"{"a":1,"a":2}"#,
        r#""\ud83d""#,
        r#""\ude00""#,
        "[1,]",
        "{\"a\" 1}",
        "01",
        "1.",
        "-",
        "\"a\u{1}b\"",
        "tru",
        "[1] [2]",
        "",
    ] {
        assert_eq!(canon(bad), None, "{bad:?} must not canonicalise");
    }
    let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
    assert_eq!(canon(&deep), None);
    let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
    assert_eq!(canon(&ok), Some(ok));
}

#[test]
fn agrees_with_serde_json_on_meaning() {
    let doc = r#"{"title":"Buy milk","tags":["a","b"],"n":{"x":1.5,"y":[true,false,null]}}"#;
    let ours = canon(doc).unwrap();
    let a: serde_json::Value = serde_json::from_str(doc).unwrap();
    let b: serde_json::Value = serde_json::from_str(&ours).unwrap();
    assert_eq!(a, b);
}

/// Nested JSON documents: objects, arrays, strings with escapes and non-ASCII text, integers,
/// decimals, booleans and nulls, up to four levels deep.
fn nested_document() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e6f64..1e6).prop_map(serde_json::Value::from),
        "[a-z\u{e9}\u{1f600}\"\\\n\t/]{0,8}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z\u{e9}\"]{0,5}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `value` written with every object's members in reverse order and with white space, as
/// another client might serialise it.
fn reversed_and_spaced(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let members: Vec<String> = map
                .iter()
                .rev()
                .map(|(k, v)| {
                    format!(
                        " {} : {} ",
                        serde_json::to_string(k).unwrap(),
                        reversed_and_spaced(v)
                    )
                })
                .collect();
            format!("{{\n{}\n}}", members.join(",\n"))
        }
        serde_json::Value::Array(items) => {
            let items: Vec<String> = items.iter().map(reversed_and_spaced).collect();
            format!("[ {} ]", items.join(" , "))
        }
        other => serde_json::to_string(other).unwrap(),
    }
}

/// Keys that sort differently written and unescaped, and pairs that are one key written two
/// ways (`"a"` and `"\u0061"`, `"\n"` and `"\u000a"`).
const ESCAPED_KEYS: &[&str] = &[
    r#""a""#,
    r#""b""#,
    r#""\u0061""#,
    r#""\n""#,
    r#""\u000a""#,
    r#""\"""#,
    r#""\\""#,
    r#""\u001f""#,
    r#""\u00e9""#,
    r#""é""#,
    r#""\t""#,
    r#""""#,
    r#""a\u0000""#,
    r#""a\b""#,
    r#""\/""#,
    r#""~""#,
    r#""A""#,
    r#""0""#,
];

/// The bytes JSON is made of, to build near-JSON at random.
const JSON_BYTES: &[u8] = b"{}[],:\"\\ 0a1-.eEtrufnl\n";

/// Issue 28 item 5: a body nested deep with every level out of key order is not re-copied once
/// per level: past twice its size in moves, the tree writes it, and the form is the same.
#[test]
fn a_deep_body_out_of_order_is_handed_to_the_tree_with_the_same_form() {
    // {"z":{"z":{ ... {"z":"<pad>","a":1} ... ,"a":1},"a":1}, 100 levels, about 100 KiB.
    let mut body = format!("{{\"z\":\"{}\",\"a\":1}}", "x".repeat(100_000));
    for _ in 0..100 {
        body = format!("{{\"z\":{body},\"a\":1}}");
    }
    let mut buffers = super::Buffers::default();
    let streamed = buffers.canonicalize(body.as_bytes()).map(<[u8]>::to_vec);
    assert_eq!(
        buffers.handed_to_the_tree, 1,
        "the writer should have given up"
    );
    assert_eq!(streamed, canonicalize_tree(body.as_bytes()));
    assert!(streamed.is_some_and(|form| form.starts_with(b"{\"a\":1,\"z\":{\"a\":1,")));
    // A shallow body out of order stays with the writer.
    let shallow = br#"{"b":{"d":1,"c":2},"a":[{"y":1,"x":2}]}"#;
    let mut buffers = super::Buffers::default();
    assert!(buffers.canonicalize(shallow).is_some());
    assert_eq!(buffers.handed_to_the_tree, 0);
    // Not JSON stays not JSON, and a duplicate key deep down is still refused.
    let mut duplicate = String::from("{\"k\":1,\"k\":2}");
    for _ in 0..100 {
        duplicate = format!("{{\"z\":{duplicate},\"a\":\"{}\"}}", "y".repeat(1000));
    }
    assert_eq!(
        super::Buffers::default().canonicalize(duplicate.as_bytes()),
        None
    );
}

proptest::proptest! {
    #[test]
    fn agrees_with_serde_json_on_nested_documents(value in nested_document()) {
        let compact = serde_json::to_vec(&value).unwrap();
        let pretty = serde_json::to_vec_pretty(&value).unwrap();
        let reversed = reversed_and_spaced(&value);
        let canonical = canonicalize(&compact);
        proptest::prop_assert!(canonical.is_some(), "serde_json's output must canonicalise");
        let canonical = canonical.unwrap();
        // Same meaning: the canonical form parses to what the document parses to (both read
        // by serde_json, whose float parsing is not exact without `float_roundtrip`).
        let back: serde_json::Value = serde_json::from_slice(&canonical).unwrap();
        let read: serde_json::Value = serde_json::from_slice(&compact).unwrap();
        proptest::prop_assert_eq!(&back, &read);
        // One form whatever the layout and key order.
        proptest::prop_assert_eq!(canonicalize(&pretty), Some(canonical.clone()));
        proptest::prop_assert_eq!(canonicalize(reversed.as_bytes()), Some(canonical.clone()));
        // Canonical is a fixed point.
        proptest::prop_assert_eq!(canonicalize(&canonical), Some(canonical.clone()));
    }

    #[test]
    fn never_panics_on_arbitrary_bytes(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = canonicalize(&raw);
    }

    /// The form written straight from the input is the tree's, byte for byte, and refuses what
    /// the tree refuses: for documents in any layout and key order.
    #[test]
    fn the_streamed_form_is_the_trees(value in nested_document()) {
        for written in [
            serde_json::to_vec(&value).unwrap(),
            serde_json::to_vec_pretty(&value).unwrap(),
            reversed_and_spaced(&value).into_bytes(),
        ] {
            proptest::prop_assert_eq!(canonicalize(&written), canonicalize_tree(&written));
        }
    }

    /// The same for objects whose keys hold escapes, in any order, duplicates written
    /// differently included, nested; and for strings of JSON's own characters.
    #[test]
    fn the_streamed_form_is_the_trees_on_escaped_keys_and_any_bytes(
        keys in proptest::collection::vec(proptest::sample::select(ESCAPED_KEYS.to_vec()), 0..6),
        raw in proptest::collection::vec(proptest::sample::select(JSON_BYTES.to_vec()), 0..48),
    ) {
        let members: Vec<String> = keys.iter().enumerate().map(|(i, k)| format!("{k}:{i}")).collect();
        let object = format!("{{{}}}", members.join(","));
        let nested = format!("[{object},{{\"k\":{object}}}]");
        for written in [object.as_bytes(), nested.as_bytes(), raw.as_slice()] {
            proptest::prop_assert_eq!(canonicalize(written), canonicalize_tree(written));
        }
    }

    #[test]
    fn reserialised_json_has_the_same_canonical_form(
        entries in proptest::collection::btree_map("[a-z\u{e9}\"\\\\]{0,6}", proptest::num::i64::ANY, 0..8)
    ) {
        // serde_json writes keys in one order; writing them reversed and pretty must not matter.
        let value = serde_json::Value::Object(entries.iter().map(|(k, v)| (k.clone(), (*v).into())).collect());
        let compact = serde_json::to_vec(&value).unwrap();
        let mut reversed = String::from("{\n");
        for (i, (k, v)) in entries.iter().rev().enumerate() {
            if i > 0 { reversed.push_str(",\n"); }
            reversed.push_str(&format!("  {} :  {}", serde_json::to_string(k).unwrap(), v));
        }
        reversed.push_str("\n}");
        proptest::prop_assert_eq!(canonicalize(&compact), canonicalize(reversed.as_bytes()));
        proptest::prop_assert!(canonicalize(&compact).is_some());
    }
}

fn project(projection: &Projection, doc: &str) -> String {
    String::from_utf8(projection.apply(parse(doc.as_bytes()).unwrap()).canonical()).unwrap()
}

fn pointers(list: &[&str]) -> Vec<JsonPointer> {
    list.iter()
        .map(|p| JsonPointer::parse(p).unwrap())
        .collect()
}

#[test]
fn pointers_follow_rfc_6901() {
    assert!(
        JsonPointer::parse("").is_err(),
        "the whole document is not a part of it"
    );
    assert!(JsonPointer::parse("a").is_err());
    assert!(JsonPointer::parse("/a~2").is_err());
    let doc = r#"{"a/b":{"m~n":1,"x":2},"list":[10,20,30]}"#;
    let ignore = Projection::Ignore(pointers(&["/a~1b/m~0n", "/list/1", "/missing/deep"]));
    assert_eq!(
        project(&ignore, doc),
        r#"{"a/b":{"x":2},"list":[10,null,30]}"#
    );
}

#[test]
fn keep_counts_only_the_named_parts_with_their_objects() {
    let doc = r#"{"order":{"item":"tea","qty":2,"note":"hi"},"sent_at":5,"tags":["a","b"]}"#;
    let keep = Projection::Keep(pointers(&[
        "/order/item",
        "/order/qty",
        "/tags/0",
        "/absent",
    ]));
    // A pointer through an array keeps the array whole; an absent one keeps nothing.
    assert_eq!(
        project(&keep, doc),
        r#"{"order":{"item":"tea","qty":2},"tags":["a","b"]}"#
    );
    let keep_object = Projection::Keep(pointers(&["/order", "/order/item"]));
    assert_eq!(
        project(&keep_object, doc),
        r#"{"order":{"item":"tea","note":"hi","qty":2}}"#
    );
}

#[test]
fn unescaping_a_canonical_string_gives_back_its_bytes() {
    for c in (0u8..0x80).map(char::from).chain(['é', '😀']) {
        let mut written = Vec::new();
        let escaped = lex::write_char(c, &mut written);
        assert_eq!(escaped, written.first() == Some(&b'\\'), "{c:?}");
        let back: Vec<u8> = lex::Unescaped(&written).collect();
        assert_eq!(back, c.to_string().into_bytes(), "{c:?}");
    }
}
