//! Throwaway TLS material for tests: a CA, a server certificate for 127.0.0.1, a client one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// PEM files made by [`TlsFiles::generate`].
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA certificate.
    pub ca: PathBuf,
    /// Server certificate (SAN IP:127.0.0.1, DNS:localhost) and key.
    pub server_cert: PathBuf,
    /// Server key.
    pub server_key: PathBuf,
    /// Client certificate (CN = `client_cn`) and key.
    pub client_cert: PathBuf,
    /// Client key.
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Makes a fresh CA and certificates under `dir` with the `openssl` command.
    pub fn generate(dir: &Path, client_cn: &str) -> Self {
        std::fs::create_dir_all(dir).expect("tls dir");
        let path = |name: &str| dir.join(name);
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            dir,
            &[
                &["req", "-x509"],
                &ec[..],
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=fencelock-test-ca",
                ],
            ]
            .concat(),
        );
        for (who, cn, usage) in [
            ("server", "localhost", "serverAuth"),
            ("client", client_cn, "clientAuth"),
        ] {
            let ext = path(&format!("{who}.ext"));
            std::fs::write(
                &ext,
                format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n"),
            )
            .expect("ext file");
            let (key, csr, crt) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
            );
            let subj = format!("/CN={cn}");
            openssl(
                dir,
                &[
                    &["req"],
                    &ec[..],
                    &["-keyout", &key, "-out", &csr, "-subj", &subj],
                ]
                .concat(),
            );
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &crt,
                    "-days",
                    "2",
                    "-extfile",
                    &ext.to_string_lossy(),
                ],
            );
        }
        TlsFiles {
            ca: path("ca.crt"),
            server_cert: path("server.crt"),
            server_key: path("server.key"),
            client_cert: path("client.crt"),
            client_key: path("client.key"),
        }
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (scripts/test installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
