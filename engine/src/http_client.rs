//! The one way the engine builds an HTTP client for an outside service (an embeddings
//! endpoint today): reqwest over rustls with the `ring` crypto provider and the platform's
//! certificate verifier.
//!
//! The provider is handed to each client rather than installed as the process default, so an
//! application that embeds pyvisor keeps its own choice. `ring` rather than reqwest's default
//! `aws-lc-rs`: the same TLS, without a C library whose build dominated a clean CI run.

use std::sync::Arc;

use rustls::ClientConfig;
use rustls_platform_verifier::BuilderVerifierExt;

/// A client builder whose TLS is set up; callers add timeouts and build.
pub fn builder() -> Result<reqwest::ClientBuilder, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_platform_verifier()?
        .with_no_client_auth();
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls))
}
