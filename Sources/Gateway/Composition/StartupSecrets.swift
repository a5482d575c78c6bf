import Crypto
import GatewayConfig
import Sessions

/// The secret files, read once at start (a reload may not change them): the session key, the
/// links API's bearer secret, the identity-assertion key, and Redis's TLS files. What each held
/// is kept as a digest, so that a reload whose files changed in place is refused rather than
/// silently ignored.
struct StartupSecrets: Sendable {
    let sessionKeys: SessionKeys
    /// `identity.links.secret_file`, a trailing newline dropped (nil: no links API).
    let linksSecret: String?
    /// SHA-256 of `linksSecret`, compared with each API call's bearer token.
    let linksSecretDigest: SHA256Digest?
    /// The identity-assertion key (PEM), when assertions are enabled; each configuration
    /// generation makes its signer (issuer and lifetime reload).
    let assertionKeyPEM: String?
    /// What each file held at start, by key.
    private(set) var digests: [String: SHA256Digest]

    /// Reads and checks every secret file of `c`; a failure names its key.
    init(_ c: GatewayConfiguration) throws {
        var digests: [String: SHA256Digest] = [:]
        let secret: [UInt8]
        if let reference = c.session.secretFile {
            secret = try reference.read(key: "session.secret_file")
            digests["session.secret_file"] = SHA256.hash(data: secret)
        } else {
            secret = SessionKeys.randomSecret()
        }
        do { sessionKeys = try SessionKeys(secret: secret) } catch { throw StartupFailure(key: "session.secret_file", "\(error)") }
        for (key, reference) in Self.storeTLSFiles(c) {
            if let reference { digests[key] = SHA256.hash(data: try reference.read(key: key)) }
        }
        if let reference = c.identity.linksSecretFile {
            let bytes = try reference.read(key: "identity.links.secret_file")
            let secret = bytes.reversed().drop { $0 == 0x0a || $0 == 0x0d }.reversed()  // a trailing newline from `echo`
            guard secret.count >= 32 else { throw StartupFailure(key: "identity.links.secret_file", "holds \(secret.count) bytes; at least 32 (openssl rand -hex 32)") }
            digests["identity.links.secret_file"] = SHA256.hash(data: bytes)
            linksSecretDigest = SHA256.hash(data: Array(secret))
            linksSecret = String(decoding: secret, as: UTF8.self)
        } else {
            linksSecretDigest = nil
            linksSecret = nil
        }
        if c.identity.assertion.enabled, let reference = c.identity.assertion.keyFile {
            let bytes = try reference.read(key: "identity.assertion.key_file")
            digests["identity.assertion.key_file"] = SHA256.hash(data: bytes)
            let pem = String(decoding: bytes, as: UTF8.self)
            guard (try? IdentityAssertionSigner(pem: pem, issuer: "", ttl: 1)) != nil else {
                throw StartupFailure(key: "identity.assertion.key_file", "not a PEM P-256 private key (openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt)")
            }
            assertionKeyPEM = pem
        } else {
            assertionKeyPEM = nil
        }
        self.digests = digests
    }

    /// A secret read elsewhere (Apple's `.p8`, by `AppleServices`), compared on reload too.
    mutating func record(_ key: String, _ digest: SHA256Digest) {
        digests[key] = digest
    }

    /// The secret files of `c` whose content differs from what was read at start (or that can
    /// no longer be read), as problems for a refused reload.
    func changed(in c: GatewayConfiguration, locations: [String: ConfigLocation]) -> [ConfigProblem] {
        let references: [(String, SecretReference?)] = [
            ("session.secret_file", c.session.secretFile), ("apple.private_key_file", c.apple?.privateKeyFile),
            ("identity.assertion.key_file", c.identity.assertion.enabled ? c.identity.assertion.keyFile : nil),
            ("identity.links.secret_file", c.identity.linksSecretFile),
        ] + Self.storeTLSFiles(c)
        return references.compactMap { key, reference -> ConfigProblem? in
            guard let reference, let before = digests[key] else { return nil }
            let message: String
            do {
                guard SHA256.hash(data: try reference.read(key: key)) != before else { return nil }
                message = "\(reference): the content changed; it is read only at start: restart to use it (the reload is refused)"
            } catch {
                message = "\((error as? StartupFailure)?.message ?? "\(error)") (the running gateway keeps what it read at start; the reload is refused)"
            }
            return StartupFailure(key: key, message).problem(locations: locations)
        }
    }

    /// Redis's TLS files: read at start only, like the other secrets.
    static func storeTLSFiles(_ c: GatewayConfiguration) -> [(String, SecretReference?)] {
        guard c.store.redisURL?.tls == true else { return [] }
        return [("store.tls.ca_file", c.store.tls.caFile), ("store.tls.certificate_file", c.store.tls.certificateFile),
                ("store.tls.private_key_file", c.store.tls.privateKeyFile)].map { ($0.0, $0.1.map(SecretReference.file)) }
    }
}
