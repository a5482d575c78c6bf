import GatewayConfig
import HTTPProxy
import NIOCore
import NIOSSL

#if canImport(Glibc)
import Glibc
#endif

/// The TLS contexts the configuration's files make: the listener's certificate, https upstreams'
/// trust, Redis over TLS. Every failure is a `StartupFailure` naming its key, so `check`,
/// `serve` and a reload report it the same way.
enum TLSContexts {
    /// The listener's certificate, read and checked.
    struct ServerCertificate {
        let context: NIOSSLContext
        /// Unix seconds.
        let notValidAfter: Int64
        /// Set when the certificate expires within `renewalWarning`.
        let warning: String?
    }

    /// Certificates that expire sooner than this are warned about (certbot renews at 30 days).
    static let renewalWarning: Int64 = 14 * 86_400

    /// TLS 1.2 and 1.3 with BoringSSL's modern defaults (forward-secret AEAD suites only), ALPN
    /// `server.tls.alpn` (h2 and http/1.1 by default). The key must belong to the certificate, and the certificate must be valid now.
    static func server(_ files: GatewayConfiguration.TLSFiles, now: Int64 = Int64(time(nil))) throws -> ServerCertificate {
        let chain = try certificates(files.certificateFile, key: "server.tls.certificate_file")
        let privateKey = try key(files.privateKeyFile, key: "server.tls.private_key_file")
        let leaf = chain[0]
        let notAfter = Int64(leaf.notValidAfter)
        if notAfter <= now {
            throw StartupFailure(key: "server.tls.certificate_file", "\(files.certificateFile): the certificate expired on \(date(notAfter))")
        }
        if Int64(leaf.notValidBefore) > now {
            throw StartupFailure(key: "server.tls.certificate_file", "\(files.certificateFile): the certificate is not valid before \(date(Int64(leaf.notValidBefore)))")
        }
        var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(privateKey))
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = files.alpn.map(\.rawValue)
        let context: NIOSSLContext
        do { context = try NIOSSLContext(configuration: configuration) } catch {
            throw StartupFailure(key: "server.tls.private_key_file", "\(files.privateKeyFile): the key does not belong to the certificate in \(files.certificateFile)")
        }
        let left = notAfter - now
        let warning = left < renewalWarning
            ? "\(files.certificateFile): the certificate expires in \(left / 86_400) days (\(date(notAfter))); renew it and reload (SIGHUP)" : nil
        return ServerCertificate(context: context, notValidAfter: notAfter, warning: warning)
    }

    /// The client side of an https upstream (nil for http://).
    static func upstream(_ route: GatewayConfiguration.Route, index: Int) throws -> UpstreamTLS? {
        guard route.upstream.tls else { return nil }
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        configuration.applicationProtocols = ["http/1.1"]
        if let file = route.upstreamCAFile {
            configuration.trustRoots = .certificates(try certificates(file, key: "routes[\(index)].upstream_ca_file"))
        }
        if route.upstreamInsecureSkipVerify { configuration.certificateVerification = .none }
        let context: NIOSSLContext
        do { context = try NIOSSLContext(configuration: configuration) } catch {
            throw StartupFailure(key: "routes[\(index)].upstream", "cannot set up TLS: \(error)")
        }
        return UpstreamTLS(context: context, serverName: route.upstreamServerName ?? sniName(route.upstream.host))
    }

    /// The client side of `rediss://` (and of the sentinels, with TLS).
    static func redis(_ tls: GatewayConfiguration.StoreTLS) throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        if let file = tls.caFile {
            configuration.trustRoots = .certificates(try certificates(file, key: "store.tls.ca_file"))
        }
        if let certificateFile = tls.certificateFile, let keyFile = tls.privateKeyFile {
            configuration.certificateChain = try certificates(certificateFile, key: "store.tls.certificate_file").map { .certificate($0) }
            configuration.privateKey = .privateKey(try key(keyFile, key: "store.tls.private_key_file"))
        }
        do { return try NIOSSLContext(configuration: configuration) } catch {
            throw StartupFailure(key: "store.tls.private_key_file", "the key does not belong to the client certificate (\(tls.certificateFile ?? "-"))")
        }
    }

    /// SNI carries names, not addresses: an IP literal is verified against the address instead.
    static func sniName(_ host: String) -> String? {
        IPAddress.parse(host) == nil ? host : nil
    }

    private static func certificates(_ path: String, key: String) throws -> [NIOSSLCertificate] {
        guard access(path, R_OK) == 0 else {
            throw StartupFailure(key: key, "\(path): \(String(cString: strerror(errno)).lowercased())")
        }
        let chain = (try? NIOSSLCertificate.fromPEMFile(path)) ?? []
        guard !chain.isEmpty else { throw StartupFailure(key: key, "\(path): no PEM certificate (-----BEGIN CERTIFICATE-----) in the file") }
        return chain
    }

    private static func key(_ path: String, key: String) throws -> NIOSSLPrivateKey {
        guard access(path, R_OK) == 0 else {
            throw StartupFailure(key: key, "\(path): \(String(cString: strerror(errno)).lowercased())")
        }
        guard let privateKey = try? NIOSSLPrivateKey(file: path, format: .pem) else {
            throw StartupFailure(key: key, "\(path): not a PEM private key (unencrypted RSA, EC or PKCS#8)")
        }
        return privateKey
    }

    /// `2026-12-01 12:00:00 UTC`.
    static func date(_ seconds: Int64) -> String {
        var t = time_t(seconds)
        var parts = tm()
        gmtime_r(&t, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%d %H:%M:%S UTC", &parts)
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
