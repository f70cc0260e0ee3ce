//! Certificates made by a test, with Debian's `openssl` (the tests fail loudly without it): a
//! certificate authority of the test's own, a server certificate it signed for the names a test
//! gives, a client certificate it signed, and a second authority that signed nothing of these, so
//! that a test can show a server refused under the wrong CA. All P-256, valid two days, PEM files
//! in one directory: `ca.pem`, `other-ca.pem`, `server.pem`/`server.key`, `client.pem`/`client.key`.

use std::path::Path;
use std::process::Command;

/// Writes the certificates into `dir`: the server's for `server_names` (`subjectAltName` entries,
/// `IP:127.0.0.1` or `DNS:pg.test`), the client's for the common name `client`.
///
/// # Panics
///
/// When `openssl` is missing or fails.
pub fn issue(dir: &Path, server_names: &[&str], client: &str) {
    let openssl = |args: &[&str]| {
        let output = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    };
    let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    for ca in ["ca", "other-ca"] {
        let (subject, keyout, out) =
            (format!("/CN=recovea test {ca}"), format!("{ca}.key"), format!("{ca}.pem"));
        openssl(
            &[
                &["req", "-x509"][..],
                &key,
                &["-days", "2", "-subj", &subject, "-keyout", &keyout, "-out", &out],
            ]
            .concat(),
        );
    }
    let san = format!("subjectAltName={}", server_names.join(","));
    for (name, subject, extension) in [
        ("server", "/CN=recovea server".to_owned(), san),
        ("client", format!("/CN={client}"), "extendedKeyUsage=clientAuth".to_owned()),
    ] {
        let (keyout, csr) = (format!("{name}.key"), format!("{name}.csr"));
        openssl(&[&["req"][..], &key, &["-subj", &subject, "-keyout", &keyout, "-out", &csr]].concat());
        std::fs::write(dir.join(format!("{name}.ext")), extension).expect("an extension file");
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
            "-out",
            &format!("{name}.pem"),
        ]);
    }
}
