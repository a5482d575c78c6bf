import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TestSupport

/// An app server that gets HTTP wrong the way old ones do, on purpose, with raw bytes. It reads
/// requests itself (head, then `Content-Length` bytes of body) and answers by path:
///
/// | path | answer | what it leaves on the connection |
/// |---|---|---|
/// | `/late-extra` | `200`, `Content-Length: 2`, `ok` | a whole second response (`secret`), sent late |
/// | `HEAD /head` | `200`, `Content-Length: 20` | that many body bytes, `secret` inside them, sent late |
/// | `/no-content` | `204` announcing `Content-Length` | a body (`secret`), sent late |
/// | `/not-modified` | `304` announcing `Content-Length` | a body (`secret`), sent late |
/// | `/early-hints` | `103` (not echoing), then `200` `hints` | nothing |
/// | `/over-long` | `200`, `Content-Length: 2`, then more bytes in the same write | `secret` right behind it |
/// | `/static/…` | `200` without reading the request's body (CL.0) | the body, read as the next request's start |
/// | anything else | `200`, body `line=<request line>;user=<X-Auth-User>` | nothing |
///
/// It honours `Connection: close` as such apps do: it answers, closes, and reads nothing more.
/// Every answer, the late ones too, echoes the `X-Request-Id` of the request it was made for
/// (as `upstream_reuse: echo` asks), except under `/no-echo`.
///
/// "Late" is deterministic: the leftover bytes are written on the connection right before the
/// answer to its next request, that is once the connection has been taken for another request,
/// exactly where bytes sent 5–300 ms late by a real app land.
final class MisbehavingUpstream: Sendable {
    /// What a user must never see of another's.
    static let secret = "HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\nalice-secret-page"

    let channel: any Channel
    private let log: NIOLockedValueBox<[(line: String, user: String?)]>
    private let accepted: NIOLockedValueBox<Int>
    var port: Int { channel.localAddress!.port! }

    /// Connections the app accepted.
    var connections: Int { accepted.withLockedValue { $0 } }

    /// The `X-Request-Id` of every request the app parsed, in order (nil: none).
    var requestIDs: [String?] { ids.withLockedValue { $0 } }
    private let ids: NIOLockedValueBox<[String?]>

    /// Every request the app parsed: its request line and the `X-Auth-User` it carried.
    var requests: [(line: String, user: String?)] { log.withLockedValue { $0 } }

    /// Runs `body` with a started upstream, closed before this returns or rethrows.
    static func with<Result>(group: any EventLoopGroup, _ body: (MisbehavingUpstream) async throws -> Result) async throws -> Result {
        try await withTeardown(try await start(group: group), stop: { await $0.close() }, body)
    }

    private static func start(group: any EventLoopGroup) async throws -> MisbehavingUpstream {
        let log = NIOLockedValueBox<[(line: String, user: String?)]>([])
        let accepted = NIOLockedValueBox(0)
        let ids = NIOLockedValueBox<[String?]>([])
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                accepted.withLockedValue { $0 += 1 }
                return channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Handler(log: log, ids: ids)) }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        return MisbehavingUpstream(channel: channel, log: log, accepted: accepted, ids: ids)
    }

    private init(channel: any Channel, log: NIOLockedValueBox<[(line: String, user: String?)]>, accepted: NIOLockedValueBox<Int>,
                 ids: NIOLockedValueBox<[String?]>) {
        self.channel = channel
        self.log = log
        self.accepted = accepted
        self.ids = ids
    }

    func close() async { try? await channel.close() }

    private final class Handler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let log: NIOLockedValueBox<[(line: String, user: String?)]>
        let ids: NIOLockedValueBox<[String?]>
        var received: [UInt8] = []
        /// What the last answer left to send late.
        var leftover = ""
        /// A request said `Connection: close`: answered, then nothing more is read.
        var closing = false

        init(log: NIOLockedValueBox<[(line: String, user: String?)]>, ids: NIOLockedValueBox<[String?]>) {
            self.log = log
            self.ids = ids
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !closing else { return }
            received += Array(buffer: unwrapInboundIn(data))
            while !closing, let answer = nextRequest() {
                context.write(wrapOutboundOut(ByteBuffer(string: leftover + answer.now)), promise: nil)
                leftover = answer.late
            }
            context.flush()
            if closing { context.close(promise: nil) }
        }

        /// Parses one request from what arrived, if it is all there; what to answer now, and
        /// what to leave for later.
        private func nextRequest() -> (now: String, late: String)? {
            let end: [UInt8] = Array("\r\n\r\n".utf8)
            guard let headEnd = (0...max(0, received.count - 4)).first(where: { received.count >= 4 && Array(received[$0..<$0 + 4]) == end })
            else { return nil }
            let head = String(decoding: received[..<headEnd], as: UTF8.self)
            let lines = head.components(separatedBy: "\r\n")
            let requestLine = lines[0]
            var length = 0
            var user: String? = nil
            var requestID: String? = nil
            for line in lines.dropFirst() {
                guard let colon = line.firstIndex(of: ":") else { continue }
                let name = line[..<colon].lowercased()
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                if name == "content-length" { length = Int(value) ?? 0 }
                if name == "x-auth-user" { user = value }
                if name == "x-request-id" { requestID = value }
                if name == "connection", value.lowercased() == "close" { closing = true }
            }
            let parts = requestLine.split(separator: " ")
            let method = parts.first.map(String.init) ?? ""
            let path = parts.count > 1 ? String(parts[1]) : ""
            // A CL.0 endpoint answers without reading the body it was sent.
            let consumed = path.hasPrefix("/static/") ? 0 : length
            guard received.count >= headEnd + 4 + consumed else { return nil }
            received.removeFirst(headEnd + 4 + consumed)
            log.withLockedValue { $0.append((requestLine, user)) }
            ids.withLockedValue { $0.append(requestID) }
            // Every answer (the late one too) names the request it was made for.
            let echo = requestID.map { path.hasPrefix("/no-echo") ? "" : "X-Request-Id: \($0)\r\n" } ?? ""
            let answer = respond(method, path, user: user, requestLine: requestLine)
            return (Self.inserting(echo, into: answer.now), Self.inserting(echo, into: answer.late))
        }

        /// `field` as the first field line of every final response head in `text` (an interim,
        /// 1xx, head goes as written: apps echo on the final response).
        static func inserting(_ field: String, into text: String) -> String {
            guard !field.isEmpty else { return text }
            return text.replacingOccurrences(of: "HTTP/1.1 ", with: "\u{0}").components(separatedBy: "\u{0}").enumerated().map { index, part in
                guard index > 0 else { return part }
                guard !part.hasPrefix("1"), let lineEnd = part.range(of: "\r\n") else { return "HTTP/1.1 " + part }
                return "HTTP/1.1 " + part[..<lineEnd.upperBound] + field + part[lineEnd.upperBound...]
            }.joined()
        }

        private func respond(_ method: String, _ path: String, user: String?, requestLine: String) -> (now: String, late: String) {
            let secret = MisbehavingUpstream.secret
            switch (method, path) {
            case (_, "/late-extra"): return ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", secret)
            case ("HEAD", "/head"): return ("HTTP/1.1 200 OK\r\nContent-Length: \(secret.utf8.count)\r\n\r\n", secret)
            case (_, "/no-content"): return ("HTTP/1.1 204 No Content\r\nContent-Length: \(secret.utf8.count)\r\n\r\n", secret)
            case (_, "/not-modified"): return ("HTTP/1.1 304 Not Modified\r\nContent-Length: \(secret.utf8.count)\r\n\r\n", secret)
            case (_, "/early-hints"):
                return ("HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhints", "")
            case (_, "/over-long"): return ("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + secret, "")
            case (_, let p) where p.hasPrefix("/static/"): return ("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nstatic", "")
            default:
                let body = "line=\(requestLine);user=\(user ?? "-")"
                return ("HTTP/1.1 200 OK\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)", "")
            }
        }
    }
}

import Foundation
