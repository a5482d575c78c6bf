import NIOCore
import NIOHTTP1

/// Reads the responses an upstream connection sends, from the bytes as they arrive: heads
/// (`HeadParser`), framing (`MessageFraming.response`, which needs the request's method) and
/// bodies (`BodyDecoder`). What the proxy's upstream connections run, and what
/// `WireResponseDifferentialTests` compares with NIO's llhttp decoder.
///
/// Interim responses (1xx but 101) are returned as heads and the reader waits for the final
/// one; after a 101 it stops, and the bytes behind the head belong to the tunnel
/// (`takeRemaining`). Bytes nobody asked for (no request outstanding) are an error: an idle
/// upstream connection must not speak.
struct ResponseReader {
    typealias Part = WireMessagePart

    private enum State {
        case head
        case body(BodyDecoder)
        case upgraded
    }

    private var parser: HeadParser
    private var state: State = .head
    private var buffer = ByteBuffer()
    /// The methods of the requests sent and not yet answered, oldest first.
    private var outstanding: [HTTPMethod] = []

    /// NIO's decoder (llhttp) took heads up to 80 KiB with any number of fields; so does this.
    init(maxHeadBytes: Int = 80 * 1024, maxFields: Int = 1000) {
        parser = HeadParser(kind: .response, maxHeadBytes: maxHeadBytes, maxFields: maxFields)
    }

    /// A request went out: its response is framed by its method (a HEAD's has no body).
    mutating func expectResponse(to method: HTTPMethod) {
        outstanding.append(method)
    }

    /// Bytes received from the upstream.
    mutating func receive(_ bytes: ByteBuffer) {
        buffer.cumulate(bytes)
    }

    /// Bytes received and not yet read (after a response, bytes that belong to none).
    var hasUnreadBytes: Bool { buffer.readableBytes > 0 }

    /// A response so far announced a body its request's method or status says it has not
    /// (`MessageFraming.declaresUnsentBody`): what follows it on the connection is in doubt.
    private(set) var framingInDoubt = false

    /// The next part from what has arrived; nil while more bytes are needed (or after a 101).
    mutating func next() throws(WireError) -> Part? {
        switch state {
        case .upgraded:
            return nil
        case .body(var decoder):
            // Kept even when no part comes out: the decoder may have read framing (a chunk's
            // CRLF, its size line) from the buffer.
            let part = try decoder.next(&buffer)
            state = .body(decoder)
            return part.map { settle($0) }
        case .head:
            guard buffer.readableBytes > 0 else { return nil }
            guard let method = outstanding.first else {
                let onlyLineEnds = buffer.readableBytesView.allSatisfy { $0 == 0x0D || $0 == 0x0A }
                throw .malformed(onlyLineEnds ? "line ends after a response" : "unsolicited response")
            }
            guard let head = try parser.parse(&buffer) else { return nil }
            if head.status == 101 {
                state = .upgraded
                return .head(head)
            }
            if (100..<200).contains(head.status) {
                // Interim: its framing fields are checked too (llhttp does), then the final
                // response follows.
                _ = try MessageFraming.response(head, requestMethod: method)
                if MessageFraming.declaresUnsentBody(head, requestMethod: method) { framingInDoubt = true }
                return .head(head)
            }
            outstanding.removeFirst()
            state = .body(BodyDecoder(try MessageFraming.response(head, requestMethod: method), maxFields: parser.maxFields))
            if MessageFraming.declaresUnsentBody(head, requestMethod: method) { framingInDoubt = true }
            return .head(head)
        }
    }

    /// The connection closed: the end of a body read until close; an error inside any other
    /// body or head; nil when nothing was in progress.
    mutating func finish() throws(WireError) -> Part? {
        switch state {
        case .upgraded:
            return nil
        case .body(var decoder):
            let part = try decoder.finish()
            return settle(part)
        case .head:
            guard buffer.readableBytes == 0 else { throw .malformed("connection closed within a head") }
            return nil
        }
    }

    /// A response body is being read (a close now truncates it).
    var readingBody: Bool { if case .body = state { return true } else { return false } }

    /// After a 101: the bytes that came behind its head (the tunnel's first bytes).
    mutating func takeRemaining() -> ByteBuffer {
        defer { buffer = ByteBuffer() }
        return buffer
    }

    private mutating func settle(_ part: BodyDecoder.Part) -> Part {
        switch part {
        case .body(let bytes):
            return .body(bytes)
        case .end(let trailers):
            state = .head
            return .end(trailers)
        }
    }
}
