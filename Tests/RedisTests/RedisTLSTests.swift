import Logging
import NIOCore
import NIOPosix
import NIOSSL
import TestSupport
import Testing

@testable import Redis

/// `rediss://`: the client and the subscriber against a redis-server that serves TLS only,
/// with certificates from a CA made for the test.
@Suite("Redis over TLS against redis-server", .serialized, .timeLimit(.minutes(1)))
struct RedisTLSTests {
    /// A client context trusting `ca` only, presenting `certificate` when given.
    static func context(trusting ca: TestCA, certificate: TestCA.Leaf? = nil) throws -> NIOSSLContext {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = .tlsv12
        configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(ca.certificateFile))
        if let certificate {
            configuration.certificateChain = try NIOSSLCertificate.fromPEMFile(certificate.certificateFile).map { .certificate($0) }
            configuration.privateKey = .privateKey(try NIOSSLPrivateKey(file: certificate.privateKeyFile, format: .pem))
        }
        return try NIOSSLContext(configuration: configuration)
    }

    /// A TLS-only redis-server with a certificate from `ca` for `dnsNames` and `ipAddresses`.
    static func server(_ ca: TestCA, dnsNames: [String] = ["localhost"], ipAddresses: [String] = ["127.0.0.1"], authClients: Bool = false,
                       arguments: [String] = []) throws -> RedisServerProcess {
        let leaf = try ca.issue("redis", dnsNames: dnsNames, ipAddresses: ipAddresses)
        return try RedisServerProcess(arguments: arguments, tls: .init(certificateFile: leaf.certificateFile, privateKeyFile: leaf.privateKeyFile,
                                                                       caFile: ca.certificateFile, authClients: authClients))
    }

    /// Commands get seconds (the suites share 2 loaded cores): a refused handshake must fail as
    /// `.tls` well before that, not run into the timeout.
    static func configuration(port: Int, tls: RedisTLS, username: String? = nil, password: String? = nil) -> RedisClient.Configuration {
        var configuration = RedisClient.Configuration(host: "127.0.0.1", port: port, username: username, password: password, commandTimeout: .seconds(3),
                                                      minimumBackoff: .milliseconds(20), maximumBackoff: .milliseconds(200))
        configuration.tls = tls
        return configuration
    }

    static func client(_ configuration: RedisClient.Configuration) throws -> RedisClient {
        try RedisClient(configuration: configuration, group: MultiThreadedEventLoopGroup.singleton, logger: Logger(label: "test"))
    }

    /// The error of the first command on a new client (nil if it succeeded), and how long it took.
    static func firstCommandError(_ configuration: RedisClient.Configuration) async throws -> (RedisError?, Duration) {
        try await withTeardown(client(configuration), stop: { await $0.close() }) { redis in
            let started = ContinuousClock.now
            do {
                _ = try await redis.send(["PING"])
                return (nil, ContinuousClock.now - started)
            } catch let error as RedisError {
                return (error, ContinuousClock.now - started)
            }
        }
    }

    static func isTLS(_ error: RedisError?) -> Bool {
        if case .tls? = error { return true }
        return false
    }

    @Test("PING, SET and GET over TLS with a context that trusts the server's CA")
    func commands() async throws {
        let ca = try TestCA()
        defer { ca.remove() }
        let server = try Self.server(ca)
        defer { server.stop() }
        let redis = try Self.client(Self.configuration(port: server.port, tls: RedisTLS(context: try Self.context(trusting: ca))))
        #expect(try await redis.send(["PING"]) == .simpleString("PONG"))
        #expect(try await redis.send(["SET", "k", .bytes([0, 13, 10, 255])]) == .simpleString("OK"))
        #expect(try await redis.send(["GET", "k"]) == .bulkString([0, 13, 10, 255]))
        await redis.close()
    }

    @Test("a server certificate from another CA fails the connect with .tls at once, not by timeout")
    func untrustedServer() async throws {
        let ca = try TestCA(), other = try TestCA(name: "Another CA")
        defer { ca.remove(); other.remove() }
        let server = try Self.server(ca)
        defer { server.stop() }
        let (error, elapsed) = try await Self.firstCommandError(Self.configuration(port: server.port, tls: RedisTLS(context: try Self.context(trusting: other))))
        #expect(Self.isTLS(error), "got \(String(describing: error))")
        #expect(elapsed < .seconds(2), "failed in \(elapsed)")
    }

    @Test("mutual TLS (tls-auth-clients yes): refused without a client certificate, served with one from the CA")
    func clientCertificate() async throws {
        let ca = try TestCA()
        defer { ca.remove() }
        let server = try Self.server(ca, authClients: true)
        defer { server.stop() }
        // TLS 1.3: the client finishes its handshake before the server checks the (missing)
        // certificate; the server's alert then fails the first command.
        let (error, elapsed) = try await Self.firstCommandError(Self.configuration(port: server.port, tls: RedisTLS(context: try Self.context(trusting: ca))))
        #expect(Self.isTLS(error), "got \(String(describing: error))")
        #expect(elapsed < .seconds(2), "failed in \(elapsed)")

        let leaf = try ca.issue("gateway", dnsNames: [], ipAddresses: [])
        let redis = try Self.client(Self.configuration(port: server.port, tls: RedisTLS(context: try Self.context(trusting: ca, certificate: leaf))))
        #expect(try await redis.send(["SET", "k", "v"]) == .simpleString("OK"))
        #expect(try await redis.send(["GET", "k"]).string == "v")
        await redis.close()
    }

    @Test("an ACL user over TLS: the client authenticates, and a message published reaches the subscriber")
    func aclUserOverTLS() async throws {
        let ca = try TestCA()
        defer { ca.remove() }
        let server = try Self.server(ca, arguments: ["--user", "default", "off", "--user", "gateway", "on", ">s3cret", "~*", "&*", "+@all"])
        defer { server.stop() }
        let configuration = Self.configuration(port: server.port, tls: RedisTLS(context: try Self.context(trusting: ca)), username: "gateway", password: "s3cret")
        let (subscriber, events, sink) = try RedisSubscriberTests.subscriber(configuration)
        let client = try Self.client(configuration)
        subscriber.start()
        var iterator = events.makeAsyncIterator()
        #expect(await iterator.next() == .connected)
        #expect(try await client.send(["ACL", "WHOAMI"]).string == "gateway")
        #expect(try await client.send(["PUBLISH", "sg:invalidate", "user 003"]).int == 1)
        #expect(await iterator.next() == .message("sg:invalidate", "user 003"))

        var anonymous = configuration
        anonymous.username = nil
        anonymous.password = nil
        let (error, _) = try await Self.firstCommandError(anonymous)
        guard case .server(let reply)? = error else { Issue.record("got \(String(describing: error))"); return }
        #expect(reply.kind == .authentication && reply.message.hasPrefix("NOAUTH"), "TLS is up; the default user is off")
        await subscriber.stop()
        await client.close()
        sink.finish()
    }

    @Test("a certificate for the name redis.test only: dialling 127.0.0.1 fails; with serverName redis.test it works")
    func serverNameOverride() async throws {
        let ca = try TestCA()
        defer { ca.remove() }
        let server = try Self.server(ca, dnsNames: ["redis.test"], ipAddresses: [])
        defer { server.stop() }
        let context = try Self.context(trusting: ca)
        let (error, elapsed) = try await Self.firstCommandError(Self.configuration(port: server.port, tls: RedisTLS(context: context)))
        #expect(Self.isTLS(error), "the address is not in the certificate; got \(String(describing: error))")
        #expect(elapsed < .seconds(2), "failed in \(elapsed)")

        let redis = try Self.client(Self.configuration(port: server.port, tls: RedisTLS(context: context, serverName: "redis.test")))
        #expect(try await redis.send(["PING"]) == .simpleString("PONG"))
        #expect(try await redis.send(["SET", "k", "v"]) == .simpleString("OK"))
        await redis.close()
    }
}
