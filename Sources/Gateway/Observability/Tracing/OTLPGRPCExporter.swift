import GatewayConfig
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL

/// OTLP over gRPC (`tracing.protocol: grpc`): the unary call
/// `opentelemetry.proto.collector.trace.v1.TraceService/Export` on one HTTP/2 connection to the
/// collector (h2c for `http://`, TLS with ALPN `h2` for `https://`), dialled again when it is
/// lost. A call succeeds when the collector answers `grpc-status: 0`.
///
/// gRPC's framing is small enough to speak here: a 5-byte prefix (not compressed, length) before
/// the protobuf message, `te: trailers`, and the status in the trailers (or in the headers of a
/// trailers-only answer).
final class OTLPGRPCExporter: SpanExporter {
    let endpoint: String
    private let host: String
    private let port: Int
    private let tls: NIOSSLContext?
    private let headers: [(String, String)]
    private let timeout: TimeAmount
    private let group: any EventLoopGroup
    private let connection = NIOLockedValueBox<Connection?>(nil)

    /// The collector's connection; its multiplexer opens a stream per call.
    private typealias Connection = (channel: any Channel, multiplexer: NIOHTTP2Handler.StreamMultiplexer)

    static let path = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

    /// Throws when the TLS context for an `https://` collector cannot be made (never falls back
    /// to cleartext: `tracing.headers` may carry a key).
    init(_ c: GatewayConfiguration.Tracing, group: any EventLoopGroup) throws {
        endpoint = c.endpoint
        let secure = c.endpoint.lowercased().hasPrefix("https://")
        let authority = c.endpoint.dropFirst(secure ? 8 : 7).prefix { $0 != "/" }
        // `[v6]:port`, `host:port` or `host`.
        if authority.hasPrefix("["), let close = authority.firstIndex(of: "]") {
            host = String(authority[authority.index(after: authority.startIndex)..<close])
            port = Int(authority[close...].dropFirst(2)) ?? (secure ? 443 : 4317)
        } else if let colon = authority.lastIndex(of: ":") {
            host = String(authority[..<colon])
            port = Int(authority[authority.index(after: colon)...]) ?? (secure ? 443 : 4317)
        } else {
            host = String(authority)
            port = secure ? 443 : 4317
        }
        if secure {
            var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
            tlsConfiguration.applicationProtocols = ["h2"]
            tls = try NIOSSLContext(configuration: tlsConfiguration)
        } else {
            tls = nil
        }
        headers = c.headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        timeout = TimeAmount(c.timeout)
        self.group = group
    }

    func export(_ request: [UInt8]) async throws {
        let (channel, multiplexer) = try await connect()
        do {
            try await call(request, on: multiplexer, eventLoop: channel.eventLoop)
        } catch let error as SpanExportError where error.answered {
            throw error
        } catch {
            // A connection that failed a call without an answer is not trusted with the next.
            drop(channel)
            throw error
        }
    }

    func abandon() {
        connection.withLockedValue { $0 }?.channel.close(promise: nil)
    }

    func shutdown() async {
        if let channel = connection.withLockedValue({ $0?.channel }) {
            drop(channel)
            try? await channel.closeFuture.get()
        }
    }

    private func drop(_ channel: any Channel) {
        connection.withLockedValue { if $0?.channel === channel { $0 = nil } }
        channel.close(promise: nil)
    }

    /// The open connection, or a new one: TLS, then HTTP/2, set up before it is active.
    private func connect() async throws -> Connection {
        if let open = connection.withLockedValue({ $0 }), open.channel.isActive { return open }
        let tls = self.tls
        let host = self.host
        let multiplexer = group.next().makePromise(of: NIOHTTP2Handler.StreamMultiplexer.self)
        let channel: any Channel
        do {
            channel = try await ClientBootstrap(group: multiplexer.futureResult.eventLoop)
                .connectTimeout(min(.seconds(5), timeout))
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        if let tls {
                            try sync.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: IPAddress.parse(host) == nil ? host : nil))  // no SNI for an address
                        }
                        // Nothing is served on streams the collector opens.
                        multiplexer.succeed(try sync.configureHTTP2Pipeline(
                            mode: .client, connectionConfiguration: .init(), streamConfiguration: .init(),
                            inboundStreamInitializer: { $0.close() }))
                    }
                }
                .connect(host: host, port: port).get()
        } catch {
            multiplexer.fail(error)
            throw error
        }
        let open: Connection = (channel, try await multiplexer.futureResult.get())
        connection.withLockedValue { $0 = open }
        return open
    }

    private func call(_ message: [UInt8], on multiplexer: NIOHTTP2Handler.StreamMultiplexer, eventLoop: any EventLoop) async throws {
        let answer = eventLoop.makePromise(of: Void.self)
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: Self.path)
        let name = host.contains(":") ? "[\(host)]" : host
        head.headers.add(name: "host", value: port == (tls == nil ? 80 : 443) ? name : "\(name):\(port)")
        head.headers.add(name: "content-type", value: "application/grpc")
        head.headers.add(name: "te", value: "trailers")
        head.headers.add(name: "grpc-timeout", value: "\(max(1, timeout.nanoseconds / 1_000_000))m")
        head.headers.add(name: "user-agent", value: "sessiongate/\(BuildInfo.version)")
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        var framed = ByteBuffer()
        framed.writeInteger(UInt8(0))
        framed.writeInteger(UInt32(message.count))
        framed.writeBytes(message)
        let (request, body) = (head, framed)
        let scheme: HTTP2FramePayloadToHTTP1ClientCodec.HTTPProtocol = tls == nil ? .http : .https
        let timer = eventLoop.scheduleTask(in: timeout) { answer.fail(SpanExportError("no answer within tracing.timeout")) }
        defer { timer.cancel() }
        multiplexer.createStreamChannel { stream in
            stream.eventLoop.makeCompletedFuture {
                try stream.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ClientCodec(httpProtocol: scheme))
                try stream.pipeline.syncOperations.addHandler(GRPCAnswer(answer: answer))
                stream.write(HTTPClientRequestPart.head(request), promise: nil)
                stream.write(HTTPClientRequestPart.body(.byteBuffer(body)), promise: nil)
                stream.writeAndFlush(HTTPClientRequestPart.end(nil)).whenFailure { answer.fail($0) }
            }
        }.whenFailure { answer.fail($0) }
        try await answer.futureResult.get()
    }
}

/// Reads one gRPC answer on its stream: the HTTP status, then `grpc-status` from the trailers
/// (or from a trailers-only head).
private final class GRPCAnswer: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart
    private let answer: EventLoopPromise<Void>
    private var status: String? = nil
    private var message: String? = nil

    init(answer: EventLoopPromise<Void>) { self.answer = answer }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            guard head.status == .ok else {
                answer.fail(SpanExportError("the collector answered HTTP \(head.status.code)", answered: true))
                return
            }
            note(head.headers)
        case .body:
            break
        case .end(let trailers):
            if let trailers { note(trailers) }
            switch status {
            case "0": answer.succeed()
            case let status?:
                answer.fail(SpanExportError("the collector answered grpc-status \(status)\(message.map { ": \($0.prefix(200))" } ?? "")", answered: true))
            case nil: answer.fail(SpanExportError("the collector's answer has no grpc-status"))
            }
            context.close(promise: nil)
        }
    }

    private func note(_ headers: HTTPHeaders) {
        if let status = headers.first(name: "grpc-status") { self.status = status }
        if let message = headers.first(name: "grpc-message") { self.message = message }
    }

    func channelInactive(context: ChannelHandlerContext) {
        answer.fail(SpanExportError("the collector closed the stream"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        answer.fail(error)
        context.close(promise: nil)
    }
}
