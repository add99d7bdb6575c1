//! `/openapi.json` checked against the live server: every route in the README's API table is
//! documented with its methods, every documented operation reaches a handler (never the
//! "no such route" fallback nor 405) while undocumented methods get 405, the README's example
//! bodies satisfy the documented request schemas, and a real 2xx of every operation matches its
//! documented response schema.

use std::collections::{BTreeMap, BTreeSet};

use recollect_tests::distributed::{Deployment, Mode};
use recollect_tests::Server;
use serde_json::Value;

const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// Resolves `{"$ref": "#/components/schemas/X"}`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.strip_prefix("#/components/schemas/").expect("local ref");
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

fn type_matches(t: &str, v: &Value) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        other => panic!("schema type {other} not handled"),
    }
}

/// Validates `v` against the subset of JSON Schema the document uses; errors name the path.
fn validate(doc: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = resolve(doc, schema);
    for key in ["oneOf", "anyOf"] {
        if let Some(alts) = s.get(key).and_then(Value::as_array) {
            let ok = alts.iter().any(|alt| {
                let mut e = Vec::new();
                validate(doc, alt, v, at, &mut e);
                e.is_empty()
            });
            if !ok {
                errors.push(format!("{at}: matches none of {key}"));
            }
        }
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        // An object composed of parts (serde's flatten): each part documents some of its
        // properties, so the parts are merged before the object is checked as a whole.
        let mut props = serde_json::Map::new();
        let mut required = Vec::new();
        for sub in all {
            let sub = resolve(doc, sub);
            if let Some(p) = sub.get("properties").and_then(Value::as_object) {
                props.extend(p.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            required.extend(
                sub.get("required")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        let merged =
            serde_json::json!({"type": "object", "properties": props, "required": required});
        validate(doc, &merged, v, at, errors);
    }
    match s.get("type") {
        Some(Value::String(t)) if !type_matches(t, v) => {
            errors.push(format!("{at}: expected {t}, got {v}"));
            return;
        }
        Some(Value::Array(ts)) if !ts.iter().any(|t| type_matches(t.as_str().unwrap(), v)) => {
            errors.push(format!("{at}: expected one of {ts:?}, got {v}"));
            return;
        }
        _ => {}
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            if !obj.contains_key(r) {
                errors.push(format!("{at}: required property {r} is missing"));
            }
        }
        for (k, val) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => validate(doc, ps, val, &format!("{at}.{k}"), errors),
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        errors.push(format!("{at}: property {k} is not documented"))
                    }
                    Some(ap @ Value::Object(_)) => {
                        validate(doc, ap, val, &format!("{at}.{k}"), errors)
                    }
                    // Only object schemas with documented properties are closed here: a
                    // response with a key the document does not name is a mismatch.
                    _ if props.is_some() => {
                        errors.push(format!("{at}: property {k} is not documented"))
                    }
                    _ => {}
                },
            }
        }
    }
    if let (Some(items), Some(arr)) = (s.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            validate(doc, items, x, &format!("{at}[{i}]"), errors);
        }
    }
}

fn check(doc: &Value, schema: &Value, v: &Value, what: &str) {
    let mut errors = Vec::new();
    validate(doc, schema, v, "$", &mut errors);
    assert!(
        errors.is_empty(),
        "{what} does not match its schema: {errors:#?}\n{v}"
    );
}

/// (METHOD, path) rows of the README's API table.
fn readme_routes(readme: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    let table = readme
        .split("## API")
        .nth(1)
        .expect("README has an API section");
    for line in table.lines().take_while(|l| !l.starts_with("- ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 3 || !METHODS.contains(&cells[1].to_lowercase().as_str()) {
            continue;
        }
        for path in cells[2].split(',') {
            out.insert((
                cells[1].to_lowercase(),
                path.trim().trim_matches('`').to_string(),
            ));
        }
    }
    out
}

/// The JSON bodies of the README's curl examples, by request path.
fn readme_bodies(readme: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut rest = readme;
    while let Some(i) = rest.find("curl -s -X POST localhost:8080") {
        rest = &rest[i + "curl -s -X POST localhost:8080".len()..];
        let path: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
        let start = rest.find("-d '").expect("a body") + 4;
        let end = start + rest[start..].find('\'').expect("closing quote");
        let body: Value = serde_json::from_str(&rest[start..end]).expect("README body is JSON");
        out.push((path, body));
    }
    out
}

fn request_schema<'a>(doc: &'a Value, path: &str, method: &str) -> &'a Value {
    &doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
}

fn response_schema<'a>(doc: &'a Value, path: &str, method: &str, status: u16) -> &'a Value {
    let content = &doc["paths"][path][method]["responses"][status.to_string()]["content"];
    assert!(
        content.is_object(),
        "{method} {path}: {status} is not documented"
    );
    let (_, media) = content.as_object().unwrap().iter().next().unwrap();
    &media["schema"]
}

/// One raw HTTP call: (status, body text).
fn call(s: &Server, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut r = s.client.request(m, format!("{}{path}", s.url));
    if let Some(b) = body {
        r = r.json(b);
    }
    let resp = r.send().unwrap();
    (resp.status().as_u16(), resp.text().unwrap_or_default())
}

/// The work operations (method, path) of a document.
fn work_operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            if path.starts_with("/v1/") && item.get(m).is_some() {
                out.insert((m.to_string(), path.clone()));
            }
        }
    }
    out
}

/// The API's document: the embedded server's, or in distributed mode the union of the
/// gateway's and the query service's, each of which must list only its own operations.
fn api_document(s: &Deployment) -> Value {
    let fetch = |url: &str| -> Value {
        let r = s.client.get(format!("{url}/openapi.json")).send().unwrap();
        assert_eq!(r.status().as_u16(), 200);
        r.json().unwrap()
    };
    let Some(p) = &s.pipeline else {
        return fetch(&s.url);
    };
    let gateway = fetch(&p.gateway.url);
    let query = fetch(&p.query_direct_url);
    let (g_ops, q_ops) = (work_operations(&gateway), work_operations(&query));
    assert!(g_ops.is_disjoint(&q_ops), "{g_ops:?} / {q_ops:?}");
    for (m, path) in &g_ops {
        assert!(
            recollect_tests::distributed::is_store_path(
                &m.to_uppercase().parse().unwrap(),
                &path.replace("{id}", "probe")
            ),
            "the gateway documents {m} {path}, which the ingress sends to the query service"
        );
    }
    let mut doc = query;
    for (path, item) in gateway["paths"].as_object().unwrap() {
        let slot = &mut doc["paths"][path];
        if slot.is_null() {
            *slot = serde_json::json!({});
        }
        for (k, v) in item.as_object().unwrap() {
            slot[k] = v.clone();
        }
    }
    for (name, schema) in gateway["components"]["schemas"].as_object().unwrap() {
        doc["components"]["schemas"][name] = schema.clone();
    }
    doc
}

#[test]
fn openapi_document_matches_the_served_api_embedded() {
    openapi_document_matches_the_served_api(Mode::Embedded);
}

#[test]
fn openapi_document_matches_the_served_api_distributed() {
    if Mode::distributed_available() {
        openapi_document_matches_the_served_api(Mode::Distributed);
    }
}

fn openapi_document_matches_the_served_api(mode: Mode) {
    let dir = tempfile::tempdir().unwrap();
    let s = Deployment::start(
        mode,
        dir.path(),
        &[
            ("RECOLLECT__EMBEDDER__KIND", "hash"),
            ("RECOLLECT__SERVER__ADMIN_KEY", "adm"),
        ],
    );
    let doc = api_document(&s);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");

    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for m in METHODS {
            if item.get(m).is_some() {
                documented.entry(path.clone()).or_default().insert(m.into());
            }
        }
    }
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let routes = readme_routes(&readme);
    assert!(routes.len() >= 9, "{routes:?}");
    for (m, p) in &routes {
        assert!(
            documented.get(p).is_some_and(|ms| ms.contains(m)),
            "README route {m} {p} is not in /openapi.json"
        );
    }
    let documented_pairs: BTreeSet<(String, String)> = documented
        .iter()
        .flat_map(|(p, ms)| ms.iter().map(move |m| (m.clone(), p.clone())))
        .collect();
    assert_eq!(
        documented_pairs, routes,
        "/openapi.json and the README's API table list the same operations"
    );

    // The README's example bodies satisfy the documented request schemas.
    let bodies = readme_bodies(&readme);
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    for (path, body) in &bodies {
        let template = if path.starts_with("/v1/conversations/") {
            "/v1/conversations/{id}/turns"
        } else {
            path.as_str()
        };
        check(
            &doc,
            request_schema(&doc, template, "post"),
            body,
            &format!("README body for {path}"),
        );
    }
    // A request schema is not a rubber stamp: a wrong type fails it.
    let mut wrong = bodies[1].1.clone();
    wrong["k"] = Value::String("five".into());
    let mut e = Vec::new();
    validate(
        &doc,
        request_schema(&doc, "/v1/recall", "post"),
        &wrong,
        "$",
        &mut e,
    );
    assert!(!e.is_empty());

    // Every documented operation reaches a handler; undocumented methods on its path get 405.
    for (path, ms) in &documented {
        let concrete = path
            .replace(
                "/memories/{id}",
                "/memories/00000000-0000-4000-8000-000000000000",
            )
            .replace("{id}", "probe");
        for m in METHODS {
            let (st, body) = call(&s, m, &concrete, Some(&serde_json::json!({})));
            if ms.contains(m) {
                assert!(
                    st != 405 && !body.contains("no such route"),
                    "{m} {path} is documented but not served: {st} {body}"
                );
            } else {
                assert_eq!(st, 405, "{m} {path} is served but not documented: {body}");
            }
        }
    }

    // A real 2xx of every operation matches its documented response, top-level properties first.
    let (conv_path, store_body) = &bodies[0];
    let (recall_path, recall_body) = &bodies[1];
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut check_2xx = |method: &str, template: &str, concrete: &str, body: Option<&Value>| {
        let (st, text) = call(&s, method, concrete, body);
        assert!((200..300).contains(&st), "{method} {concrete}: {st} {text}");
        let schema = response_schema(&doc, template, method, st);
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text.clone()));
        let top = resolve(&doc, schema);
        if let (Some(props), Some(obj)) = (top["properties"].as_object(), v.as_object()) {
            let want: BTreeSet<&String> = props.keys().collect();
            let got: BTreeSet<&String> = obj.keys().collect();
            let required: BTreeSet<&String> = top["required"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| props.get_key_value(r.as_str().unwrap()).unwrap().0)
                .collect();
            assert!(
                required.is_subset(&got) && got.is_subset(&want),
                "{method} {template}: top-level keys {got:?}, documented {want:?}"
            );
        }
        check(&doc, schema, &v, &format!("{method} {template} {st}"));
        seen.insert((method.to_string(), template.to_string()));
        v
    };
    let stored = check_2xx(
        "post",
        "/v1/conversations/{id}/turns",
        conv_path,
        Some(store_body),
    );
    let id = stored["memory_ids"][0].as_str().unwrap().to_string();
    let recalled = check_2xx("post", "/v1/recall", recall_path, Some(recall_body));
    assert!(!recalled["memories"].as_array().unwrap().is_empty());
    check_2xx(
        "get",
        "/v1/memories/{id}",
        &format!("/v1/memories/{id}"),
        None,
    );
    let edited = check_2xx(
        "patch",
        "/v1/memories/{id}",
        &format!("/v1/memories/{id}"),
        Some(&serde_json::json!({"metadata": {"checked": true}, "wait": true})),
    );
    assert_eq!(edited["version"], 2, "{edited}");
    let history = check_2xx(
        "get",
        "/v1/memories/{id}/history",
        &format!("/v1/memories/{id}/history"),
        None,
    );
    assert_eq!(history["versions"].as_array().map(Vec::len), Some(2));
    check_2xx(
        "get",
        "/v1/conversations/{id}",
        "/v1/conversations/chat-1",
        None,
    );
    let listed = check_2xx(
        "get",
        "/v1/conversations",
        "/v1/conversations?limit=1",
        None,
    );
    assert_eq!(listed["conversations"][0], "chat-1", "{listed}");
    let page = check_2xx(
        "get",
        "/v1/conversations/{id}/turns",
        "/v1/conversations/chat-1/turns?limit=1",
        None,
    );
    assert!(
        page["next_cursor"].is_string(),
        "two turns, one a page: {page}"
    );
    for p in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        check_2xx("get", p, p, None);
    }
    let reindexing = check_2xx("post", "/v1/reindex", "/v1/reindex", None);
    assert_eq!(reindexing["turns"], 2, "{reindexing}");
    let second = stored["memory_ids"][1].as_str().unwrap().to_string();
    let forgotten = check_2xx(
        "delete",
        "/v1/memories/{id}",
        &format!("/v1/memories/{second}"),
        None,
    );
    assert_eq!(forgotten["conversation_id"], "chat-1", "{forgotten}");
    check_2xx(
        "delete",
        "/v1/conversations/{id}",
        "/v1/conversations/chat-1",
        None,
    );
    // Open mode: the single tenant is "default".
    check_2xx("delete", "/v1/tenant", "/v1/tenant?confirm=default", None);
    // The operator endpoint, with the admin key: a copy of the data dir (embedded); a
    // distributed gateway has none and says so, in the documented error shape.
    let elsewhere = tempfile::tempdir().unwrap();
    let to = elsewhere.path().join("backup");
    let r = s
        .client
        .post(format!("{}/v1/admin/backup", s.url))
        .bearer_auth("adm")
        .json(&serde_json::json!({"path": to}))
        .send()
        .unwrap();
    let st = r.status().as_u16();
    let v: Value = r.json().unwrap();
    let schema = response_schema(&doc, "/v1/admin/backup", "post", st);
    check(&doc, schema, &v, &format!("post /v1/admin/backup {st}"));
    match mode {
        Mode::Embedded => assert_eq!(st, 200, "{v}"),
        Mode::Distributed => assert_eq!(st, 400, "{v}"),
    }
    seen.insert(("post".to_string(), "/v1/admin/backup".to_string()));
    assert_eq!(
        seen, documented_pairs,
        "every documented operation was exercised"
    );
}
