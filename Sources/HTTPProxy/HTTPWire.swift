import NIOCore
import NIOHTTP1

/// Serializes responses to the client straight into one buffer: one write per head, no encoder
/// hop, and framing decided by the proxy (it knows the request method; NIO's encoder does not).
public enum HTTPWire {
    static func writeStatusLine(_ status: HTTPResponseStatus, into buffer: inout ByteBuffer) {
        buffer.writeStaticString("HTTP/1.1 ")
        buffer.writeString(String(status.code))
        buffer.writeStaticString(" ")
        buffer.writeString(status.reasonPhrase)
        buffer.writeStaticString("\r\n")
    }

    @inline(__always)
    static func writeHeader(_ name: String, _ value: String, into buffer: inout ByteBuffer) {
        buffer.writeString(name)
        buffer.writeStaticString(": ")
        buffer.writeString(value)
        buffer.writeStaticString("\r\n")
    }

    /// Whether a value may go on the wire: no control character but HTAB (RFC 9110 §5.5), so
    /// it can neither split nor end a header, nor carry bytes an app's parser reads differently
    /// (names and emails come from tokens and users; `docs/security.md`, *Identity headers*).
    @inline(__always)
    public static func isSafeValue(_ value: String) -> Bool {
        !value.utf8.contains { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7f }
    }

    /// The `Connection` field a response head carries (`ExchangeRules.connectionField`).
    @inline(__always)
    static func writeConnection(_ field: ExchangeRules.ConnectionField, into buffer: inout ByteBuffer) {
        switch field {
        case .none: break
        case .close: buffer.writeStaticString("connection: close\r\n")
        case .keepAlive: buffer.writeStaticString("connection: keep-alive\r\n")
        }
    }

    /// A complete response the gateway answers itself, as bytes.
    static func localResponse(_ response: LocalResponse, requestID: String?, keepAlive: Bool, clientVersion: HTTPVersion, headRequest: Bool,
                              allocator: ByteBufferAllocator) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: 256 + response.body.readableBytes)
        writeStatusLine(response.status, into: &buffer)
        for (name, value) in response.headers where isSafeValue(value) && isSafeValue(name) {
            writeHeader(name, value, into: &buffer)
        }
        if let requestID { writeHeader("x-request-id", requestID, into: &buffer) }
        writeHeader("content-length", String(response.body.readableBytes), into: &buffer)
        writeConnection(ExchangeRules.connectionField(keepAlive: keepAlive, clientVersion: clientVersion), into: &buffer)
        buffer.writeStaticString("\r\n")
        if !headRequest {
            var body = response.body
            buffer.writeBuffer(&body)
        }
        return buffer
    }
}

extension HTTPWire {
    /// One chunk of a chunked body: size line, data, CRLF (three writes, the data not copied).
    static func writeChunk(_ bytes: ByteBuffer, context: ChannelHandlerContext) {
        var prefix = context.channel.allocator.buffer(capacity: 12)
        prefix.writeString(String(bytes.readableBytes, radix: 16))
        prefix.writeStaticString("\r\n")
        context.write(NIOAny(prefix), promise: nil)
        context.write(NIOAny(bytes), promise: nil)
        context.write(NIOAny(ByteBuffer(staticString: "\r\n")), promise: nil)
    }
}
