//! The admin API's OpenAPI document, served at `/admin/v1/openapi.json`, and the tests that hold
//! it to the routes `Route::parse` answers.

pub(crate) const OPENAPI: &str = include_str!("../openapi.json");

#[cfg(test)]
mod tests {
    use super::OPENAPI;
    use serde_json::Value;

    /// Every (path, method) that `Control::route` answers, as the OpenAPI document spells it.
    /// This table mirrors `Route::parse`: a route added, removed or changed there must change here
    /// too, and in `openapi.json`.
    const ROUTES: &[(&str, &str)] = &[
        ("/audit", "get"),
        ("/orgs/{org}/receipts", "get"),
        ("/orgs/{org}/receipts/summary", "get"),
        ("/orgs/{org}/receipts/{receipt}", "get"),
        ("/prices", "get"),
        ("/nodes", "get"),
        ("/orgs/{org}/caps", "post"),
        ("/orgs/{org}/caps", "get"),
        ("/caps/{cap}", "get"),
        ("/caps/{cap}", "patch"),
        ("/caps/{cap}", "delete"),
        ("/orgs/{org}/spend", "get"),
        ("/orgs/{org}/alerts", "get"),
        ("/prices/{model}", "put"),
        ("/prices/{model}", "get"),
        ("/prices/{model}", "delete"),
        ("/price-imports", "post"),
        ("/fallback-prices/{kind}", "put"),
        ("/fallback-prices/{kind}", "delete"),
        ("/orgs", "post"),
        ("/orgs", "get"),
        ("/orgs/{org}", "get"),
        ("/orgs/{org}/keys", "post"),
        ("/orgs/{org}/keys", "get"),
        ("/keys/{key}/revoke", "post"),
        ("/keys/{key}", "get"),
        ("/keys/{key}", "patch"),
        ("/orgs/{org}", "patch"),
        ("/orgs/{org}/providers", "get"),
        ("/orgs/{org}/providers/{name}", "put"),
        ("/node-credentials", "post"),
        ("/node-credentials", "get"),
        ("/node-credentials/{credential}", "delete"),
        ("/orgs/{org}/audit", "get"),
        ("/orgs/{org}/tokens", "post"),
        ("/orgs/{org}/tokens", "get"),
        ("/tokens/{token}/revoke", "post"),
    ];

    /// Served by the server itself, before authorization and `Control::route`.
    const UNROUTED: &[(&str, &str)] = &[("/openapi.json", "get")];

    const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

    fn document() -> Value {
        serde_json::from_str(OPENAPI).expect("openapi.json is JSON")
    }

    #[test]
    fn every_route_is_documented() {
        let doc = document();
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")), "an OpenAPI 3 document");
        for (path, method) in ROUTES.iter().chain(UNROUTED) {
            assert!(
                doc["paths"][path][method].is_object(),
                "openapi.json lacks {} {path}",
                method.to_uppercase()
            );
        }
    }

    #[test]
    fn every_documented_operation_is_routed() {
        let doc = document();
        let paths = doc["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for method in item.as_object().expect("a path item").keys() {
                if !METHODS.contains(&method.as_str()) {
                    continue;
                }
                let pair = (path.as_str(), method.as_str());
                assert!(
                    ROUTES.contains(&pair) || UNROUTED.contains(&pair),
                    "openapi.json documents {} {path}, which nothing answers",
                    method.to_uppercase()
                );
            }
        }
    }

    #[test]
    fn every_operation_lists_the_answers_any_call_may_get() {
        let doc = document();
        for (path, method) in ROUTES {
            for (status, answer) in [("405", "MethodNotAllowed"), ("500", "Internal"), ("503", "Unavailable")]
            {
                let listed = &doc["paths"][path][method]["responses"][status];
                assert_eq!(
                    listed["$ref"].as_str(),
                    Some(format!("#/components/responses/{answer}").as_str()),
                    "{} {path} lacks its {status} answer",
                    method.to_uppercase()
                );
            }
            assert!(
                doc["paths"][path][method]["responses"]["401"].is_object(),
                "{} {path} lacks its 401 answer",
                method.to_uppercase()
            );
        }
        let retry = &doc["components"]["responses"]["Unavailable"]["headers"]["retry-after"];
        assert!(retry.is_object(), "the 503 answer names its retry-after header");
    }

    /// Each documented route as `Route::parse` reads it, its parameters given sample ids.
    fn parsed(path: &str, method: &str) -> crate::admin::routes::Route<'static> {
        let segments: Vec<&'static str> = path
            .trim_start_matches('/')
            .split('/')
            .map(|segment| match segment {
                "{org}" => "org_a",
                "{key}" => "key_a",
                "{cap}" => "cap_a",
                "{token}" => "tok_a",
                "{receipt}" => "rcpt_a",
                "{credential}" => "ncr_a",
                "{model}" | "{kind}" | "{name}" => "openai",
                literal => literal.to_owned().leak(),
            })
            .collect();
        let method = http::Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        crate::admin::routes::Route::parse(&method, segments.leak())
            .unwrap_or_else(|_| panic!("{method} {path} is not routed"))
    }

    #[test]
    fn every_operation_lists_the_refusals_an_organizations_caller_may_get() {
        use crate::admin::access::{Access, Target};
        let doc = document();
        for (path, method) in ROUTES {
            let responses = &doc["paths"][path][method]["responses"];
            let (forbidden, not_found) = match parsed(path, method).access() {
                Access::Operator => (true, false),
                Access::Of { target, write } => (write, target != Target::Orgs),
            };
            let listed = |status: &str| responses[status].is_object();
            let shown = method.to_uppercase();
            if forbidden {
                assert_eq!(
                    responses["403"]["$ref"].as_str(),
                    Some("#/components/responses/Forbidden"),
                    "{shown} {path} lacks its 403"
                );
            } else {
                assert!(!listed("403"), "{shown} {path} lists a 403 it never answers");
            }
            if not_found {
                assert!(listed("404"), "{shown} {path} lacks its 404");
            }
        }
    }

    #[test]
    fn every_path_parameter_is_declared() {
        let doc = document();
        let resolve = |p: &Value| match p["$ref"].as_str() {
            Some(r) => doc.pointer(r.trim_start_matches('#')).cloned().unwrap_or(Value::Null),
            None => p.clone(),
        };
        for (path, method) in ROUTES.iter().chain(UNROUTED) {
            let mut declared: Vec<String> = doc["paths"][path][method]["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .map(resolve)
                .filter(|p| p["in"] == "path")
                .filter_map(|p| p["name"].as_str().map(str::to_owned))
                .collect();
            let mut templated: Vec<String> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .map(str::to_owned)
                .collect();
            declared.sort();
            templated.sort();
            assert_eq!(declared, templated, "path parameters of {} {path}", method.to_uppercase());
        }
    }

    #[test]
    fn every_ref_resolves() {
        fn walk(value: &Value, at: &str, refs: &mut Vec<(String, String)>) {
            match value {
                Value::Object(map) => {
                    for (name, child) in map {
                        if name == "$ref" {
                            refs.push((at.to_owned(), child.as_str().unwrap_or("").to_owned()));
                        } else {
                            walk(child, &format!("{at}/{name}"), refs);
                        }
                    }
                }
                Value::Array(items) => {
                    for (i, child) in items.iter().enumerate() {
                        walk(child, &format!("{at}/{i}"), refs);
                    }
                }
                _ => {}
            }
        }
        let doc = document();
        let mut refs = Vec::new();
        walk(&doc, "", &mut refs);
        assert!(!refs.is_empty());
        for (at, target) in refs {
            assert!(target.starts_with("#/components/"), "{at}: $ref {target:?} is not a local component");
            assert!(
                doc.pointer(target.trim_start_matches('#')).is_some_and(|v| !v.is_null()),
                "{at}: $ref {target:?} resolves to nothing"
            );
        }
    }
}
