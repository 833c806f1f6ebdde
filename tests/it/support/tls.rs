//! Certificates the tests make (a CA, and a server certificate for
//! 127.0.0.1 and localhost signed by it) and a TLS-terminating proxy in front
//! of the test broker: what a managed cluster's TLS listener looks like to
//! posbridge, without a broker built with TLS.

use std::path::{Path, PathBuf};

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509, X509NameBuilder};

/// A test CA and a server certificate it signed, as PEM files in a folder.
pub struct TestCa {
    /// The CA certificate: what a client is told to trust.
    pub ca_file: PathBuf,
    /// The server's certificate.
    pub cert_file: PathBuf,
    /// The server's private key (PKCS#8).
    pub key_file: PathBuf,
    /// The same, in memory.
    pub cert_pem: Vec<u8>,
    /// The same, in memory.
    pub key_pem: Vec<u8>,
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn name(common_name: &str) -> openssl::x509::X509Name {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, common_name)
        .unwrap();
    name.build()
}

impl TestCa {
    /// Makes a CA and a server certificate for 127.0.0.1 / localhost in `dir`.
    pub fn new(dir: &Path) -> TestCa {
        let ca_key = key();
        let mut ca = X509::builder().unwrap();
        ca.set_version(2).unwrap();
        ca.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap())
            .unwrap();
        ca.set_subject_name(&name("posbridge test CA")).unwrap();
        ca.set_issuer_name(&name("posbridge test CA")).unwrap();
        ca.set_pubkey(&ca_key).unwrap();
        ca.set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        ca.set_not_after(&Asn1Time::days_from_now(2).unwrap())
            .unwrap();
        ca.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        ca.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()
                .unwrap(),
        )
        .unwrap();
        ca.sign(&ca_key, MessageDigest::sha256()).unwrap();
        let ca = ca.build();

        let server_key = key();
        let mut server = X509::builder().unwrap();
        server.set_version(2).unwrap();
        server
            .set_serial_number(&BigNum::from_u32(2).unwrap().to_asn1_integer().unwrap())
            .unwrap();
        server.set_subject_name(&name("127.0.0.1")).unwrap();
        server.set_issuer_name(ca.subject_name()).unwrap();
        server.set_pubkey(&server_key).unwrap();
        server
            .set_not_before(&Asn1Time::days_from_now(0).unwrap())
            .unwrap();
        server
            .set_not_after(&Asn1Time::days_from_now(2).unwrap())
            .unwrap();
        let san = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .dns("localhost")
            .build(&server.x509v3_context(Some(&ca), None))
            .unwrap();
        server.append_extension(san).unwrap();
        server
            .append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
            .unwrap();
        server.sign(&ca_key, MessageDigest::sha256()).unwrap();
        let server = server.build();

        let ca_pem = ca.to_pem().unwrap();
        let cert_pem = server.to_pem().unwrap();
        let key_pem = server_key.private_key_to_pem_pkcs8().unwrap();
        let write = |file: &str, pem: &[u8]| {
            let path = dir.join(file);
            std::fs::write(&path, pem).unwrap();
            path
        };
        TestCa {
            ca_file: write("ca.pem", &ca_pem),
            cert_file: write("server.pem", &cert_pem),
            key_file: write("server.key", &key_pem),
            cert_pem,
            key_pem,
        }
    }

    /// A TLS acceptor presenting the server certificate.
    pub fn acceptor(&self) -> tokio_native_tls::TlsAcceptor {
        let identity = native_tls::Identity::from_pkcs8(&self.cert_pem, &self.key_pem).unwrap();
        tokio_native_tls::TlsAcceptor::from(native_tls::TlsAcceptor::new(identity).unwrap())
    }
}
