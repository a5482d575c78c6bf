import NIOCore
import NIOHTTP1

/// Reads the requests a client sends, from the bytes as they arrive: heads (`HeadParser`),
/// framing (`MessageFraming.request`) and bodies (`BodyDecoder`, which bounds chunked framing).
/// What the proxy's client connections run, in place of NIO's decoder, and what
/// `WireDifferentialTests` compares with NIO's llhttp decoder.
///
/// After a request that asks to upgrade (an `Upgrade` field, or CONNECT, as llhttp decides) nothing more is
/// parsed: what follows belongs to a tunnel, or to nobody if the upgrade is refused. Those bytes
/// are held (`takeRemaining`) up to `maxHeadBytes`; beyond that the reader fails as a head too
/// large would (431), so a client cannot make the proxy buffer without bound.
struct RequestReader {
    /// `.end` carries a chunked body's trailers; the proxy drops them (an app merging them into
    /// the headers would see fields never checked).
    typealias Part = WireMessagePart

    private enum State {
        case head
        case body(BodyDecoder, upgrade: Bool)
        /// After an upgrade request: bytes are held, not parsed.
        case stopped
    }

    private var parser: HeadParser
    private var state: State = .head
    private var buffer = ByteBuffer()

    init(maxHeadBytes: Int, maxFields: Int) {
        parser = HeadParser(kind: .request, maxHeadBytes: maxHeadBytes, maxFields: maxFields)
    }

    /// Bytes received from the client.
    mutating func receive(_ bytes: ByteBuffer) {
        buffer.cumulate(bytes)
    }

    /// The next part from what has arrived; nil while more bytes are needed (or after an
    /// upgrade request).
    mutating func next() throws(WireError) -> Part? {
        switch state {
        case .stopped:
            try checkHeldBytes()
            return nil
        case .body(var decoder, let upgrade):
            // Kept even when no part comes out: the decoder may have read framing.
            let part = try decoder.next(&buffer)
            state = .body(decoder, upgrade: upgrade)
            switch part {
            case nil: return nil
            case .body(let bytes): return .body(bytes)
            case .end(let trailers):
                state = upgrade ? .stopped : .head
                return .end(trailers)
            }
        case .head:
            guard buffer.readableBytes > 0, let head = try parser.parse(&buffer) else { return nil }
            let upgrade = head.method == .CONNECT || head.fields.contains { head.nameIs($0, "upgrade") }
            state = .body(BodyDecoder(try MessageFraming.request(head), maxFields: parser.maxFields), upgrade: upgrade)
            return .head(head)
        }
    }

    /// After an upgrade request: fails once more than `maxHeadBytes` are held (called while the
    /// request is being answered, when no part is asked for).
    func checkHeldBytes() throws(WireError) {
        guard case .stopped = state, buffer.readableBytes > parser.maxHeadBytes else { return }
        throw .tooLarge("more than \(parser.maxHeadBytes) bytes after an upgrade request")
    }

    /// Bytes of a next (pipelined) request are held, unparsed. Not after an upgrade request:
    /// those bytes are the tunnel's, bounded by `checkHeldBytes`.
    var holdsUnparsedRequest: Bool {
        if case .stopped = state { return false }
        return buffer.readableBytes > 0
    }

    /// The storage the reader keeps (its bound is what `cumulate` promises; tested).
    var bufferCapacity: Int { buffer.capacity }

    /// The bytes received and not parsed: after an upgrade request, the tunnel's first bytes.
    mutating func takeRemaining() -> ByteBuffer {
        defer { buffer = ByteBuffer() }
        return buffer
    }
}
