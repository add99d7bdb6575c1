//! The OpenAPI document, derived from the handlers and the types they use; each process serves
//! the operations of its own roles (the embedded binary all of them).

use crate::{Role, Roles};

/// Adds the bearer-key scheme the operations refer to.
struct BearerKey;

impl utoipa::Modify for BearerKey {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "API key; the tenant comes from it. Not needed when the server runs \
                             open (no keys configured, loopback only).",
                        ))
                        .build(),
                ),
            );
    }
}

/// The operations endpoints every process serves; the roles add their own paths.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Recollect",
        description = "Long-term memory for LLM agents: store chat turns, recall them in milliseconds."
    ),
    paths(crate::healthz, crate::readyz, crate::metrics_text, openapi_json),
    modifiers(&BearerKey)
)]
struct OpsDoc;

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations",
    responses((status = 200, description = "the OpenAPI 3.1 document of this API", body = Object)))]
#[allow(dead_code)] // documents the route the router serves with the per-role text
async fn openapi_json() {}

/// The document of the operations `roles` serve, besides the operations endpoints.
pub fn document(roles: &Roles) -> utoipa::openapi::OpenApi {
    use utoipa::OpenApi;
    let mut doc = OpsDoc::openapi();
    // Role paths first, as the embedded document always listed them.
    let mut paths = utoipa::openapi::OpenApi::default();
    if let Some(g) = &roles.gateway {
        paths.merge(g.openapi());
    }
    if let Some(q) = &roles.query {
        paths.merge(q.openapi());
    }
    let ops = std::mem::take(&mut doc.paths);
    doc.paths = paths.paths;
    doc.paths.paths.extend(ops.paths);
    if let Some(c) = paths.components {
        let mine = doc.components.get_or_insert_with(Default::default);
        mine.schemas.extend(c.schemas);
    }
    if !(roles.has(Role::Gateway) && roles.has(Role::Query)) {
        doc.info.description = Some(format!(
            "{} The operations {} serves; the others are served by {}.",
            doc.info.description.clone().unwrap_or_default(),
            roles.service(),
            if roles.has(Role::Gateway) {
                crate::QUERY_SERVICE
            } else {
                crate::GATEWAY_SERVICE
            }
        ));
    }
    doc
}

pub fn document_json(roles: &Roles) -> String {
    document(roles)
        .to_json()
        .expect("the OpenAPI document serialises")
}
