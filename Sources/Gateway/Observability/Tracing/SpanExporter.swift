import AsyncHTTPClient
import GatewayConfig
import NIOCore
import NIOHTTP1

/// Where encoded `ExportTraceServiceRequest`s go.
protocol SpanExporter: Sendable {
    /// For the log.
    var endpoint: String { get }
    /// Sends one request; throws when the collector did not accept it.
    func export(_ request: [UInt8]) async throws
    func shutdown() async
    /// Closes what the exporter holds without waiting (a process that never ran).
    func abandon()
}

struct SpanExportError: Error, CustomStringConvertible {
    let description: String
    /// The collector answered (an error status): the connection is fine for the next export.
    var answered = false

    init(_ description: String, answered: Bool = false) {
        self.description = description
        self.answered = answered
    }
}

/// OTLP/HTTP with protobuf bodies (`tracing.protocol: http/protobuf`): one POST per batch to
/// `tracing.endpoint`, with `tracing.headers`.
final class OTLPHTTPExporter: SpanExporter {
    let endpoint: String
    private let headers: [String: String]
    private let timeout: TimeAmount
    private let client: HTTPClient

    init(_ c: GatewayConfiguration.Tracing, group: any EventLoopGroup) {
        endpoint = c.endpoint
        headers = c.headers
        timeout = TimeAmount(c.timeout)
        var configuration = HTTPClient.Configuration(timeout: .init(connect: min(.seconds(5), TimeAmount(c.timeout))))
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 2)
        client = HTTPClient(eventLoopGroupProvider: .shared(group), configuration: configuration)
    }

    func export(_ request: [UInt8]) async throws {
        var post = HTTPClientRequest(url: endpoint)
        post.method = .POST
        for (name, value) in headers { post.headers.add(name: name, value: value) }
        post.headers.replaceOrAdd(name: "content-type", value: "application/x-protobuf")
        post.headers.replaceOrAdd(name: "user-agent", value: "sessiongate/\(BuildInfo.version)")
        post.body = .bytes(ByteBuffer(bytes: request))
        let response = try await client.execute(post, timeout: timeout)
        _ = try? await response.body.collect(upTo: 64 * 1024)
        guard (200..<300).contains(response.status.code) else {
            throw SpanExportError("the collector answered \(response.status.code)", answered: true)
        }
    }

    func shutdown() async { try? await client.shutdown() }
    func abandon() { try? client.syncShutdown() }
}
