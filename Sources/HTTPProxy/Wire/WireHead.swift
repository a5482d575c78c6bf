import NIOCore
import NIOHTTP1

/// Where one header field sits in a head's bytes (offsets from the head's first byte). The line
/// runs from `nameStart` to `lineEnd` (after its CRLF); the value is trimmed of OWS.
struct WireField: Equatable {
    var nameStart: Int32
    var nameLength: Int32
    var valueStart: Int32
    var valueLength: Int32
    var lineEnd: Int32
}

/// A request or response head as received: its bytes, unchanged, and where each part is. Nothing
/// is decoded into `String`s until asked for; forwarding copies the unchanged lines as they are.
struct WireHead: Sendable {
    /// The whole head: any empty lines before the start line, the start line, the fields and the
    /// empty line that ends the head.
    var bytes: ByteBuffer
    var version: HTTPVersion
    /// Requests: the method (llhttp's list of methods, the set NIO's decoder accepted before).
    var method: HTTPMethod = .GET
    /// Requests: the request target, as sent.
    var targetStart: Int32 = 0
    var targetLength: Int32 = 0
    /// Responses: the status code, and the reason phrase as sent.
    var status: Int = 0
    var reasonStart: Int32 = 0
    var reasonLength: Int32 = 0
    /// Where the first field line starts (after the start line's CRLF).
    var fieldsStart: Int32
    var fields: [WireField]

    /// The request target as a `String`.
    var target: String { string(targetStart, targetLength) }
    var reason: String { string(reasonStart, reasonLength) }

    func name(_ field: WireField) -> String { string(field.nameStart, field.nameLength) }
    func value(_ field: WireField) -> String { string(field.valueStart, field.valueLength) }

    /// Whether the field's name is `lower` (a lower-case literal of letters and `-`), without
    /// regard to case.
    @inline(__always)
    func nameIs(_ field: WireField, _ lower: StaticString) -> Bool { bytesAre(field.nameStart, field.nameLength, lower) }

    /// Whether the field's value is `lower` (as for `nameIs`).
    @inline(__always)
    func valueIs(_ field: WireField, _ lower: StaticString) -> Bool { bytesAre(field.valueStart, field.valueLength, lower) }

    /// Whether the field's value is exactly `text`, case included.
    func valueIsExactly(_ field: WireField, _ text: StaticString) -> Bool {
        bytesAre(field.valueStart, field.valueLength, text, caseFold: 0)
    }

    @inline(__always)
    private func bytesAre(_ start: Int32, _ length: Int32, _ lower: StaticString, caseFold: UInt8 = 0x20) -> Bool {
        guard Int(length) == lower.utf8CodeUnitCount else { return false }
        return bytes.withUnsafeReadableBytes { raw in
            for i in 0..<Int(length) where raw[Int(start) + i] | caseFold != lower.utf8Start[i] { return false }
            return true
        }
    }

    /// Whether the field's value is one `name=value` pair (no `;`) whose text starts with one of
    /// `prefixes` (exact bytes): a `Cookie` holding only one of the gateway's cookies.
    func valueIsOnePair(_ field: WireField, startingWithAnyOf prefixes: [String]) -> Bool {
        bytes.withUnsafeReadableBytes { raw in
            let value = UnsafeRawBufferPointer(rebasing: raw[Int(field.valueStart)..<Int(field.valueStart + field.valueLength)])
            guard !value.contains(UInt8(ascii: ";")) else { return false }
            return prefixes.contains { value.starts(with: $0.utf8) }
        }
    }

    /// What the proxy's header rules make of the field's name (`RequestHeaderRules.classify`),
    /// read from the bytes.
    func kind(of field: WireField) -> RequestHeaderRules.Kind {
        bytes.withUnsafeReadableBytes { raw in
            RequestHeaderRules.classify(bytes: UnsafeRawBufferPointer(rebasing: raw[Int(field.nameStart)..<Int(field.nameStart + field.nameLength)]))
        }
    }

    /// Whether exactly one field is named `lower`, and its value is `value` byte for byte.
    func hasOneField(_ lower: StaticString, equalTo value: String) -> Bool {
        var found = false
        for field in fields where nameIs(field, lower) {
            guard !found, Int(field.valueLength) == value.utf8.count else { return false }
            let equal = bytes.withUnsafeReadableBytes { raw in
                value.utf8.elementsEqual(UnsafeRawBufferPointer(rebasing: raw[Int(field.valueStart)..<Int(field.valueStart + field.valueLength)]))
            }
            guard equal else { return false }
            found = true
        }
        return found
    }

    /// The value of the first field named `lower` (lower case).
    func firstValue(named lower: String) -> String? {
        fields.first { nameEquals($0, lower) }.map { value($0) }
    }

    /// Every field as `HTTPHeaders`, in order (names and values as sent).
    var headers: HTTPHeaders {
        HTTPHeaders(fields.map { (name($0), value($0)) })
    }

    private func string(_ start: Int32, _ length: Int32) -> String {
        bytes.getString(at: bytes.readerIndex + Int(start), length: Int(length)) ?? ""
    }
}

/// Why bytes are not an HTTP/1.1 message: the client gets 400 (`malformed`) or 431
/// (`tooLarge`) and the connection is closed.
enum WireError: Error, Equatable, CustomStringConvertible {
    case malformed(String)
    case tooLarge(String)

    var description: String {
        switch self {
        case .malformed(let reason): return reason
        case .tooLarge(let reason): return reason
        }
    }
}

/// What a reader (`RequestReader`, `ResponseReader`) takes from the bytes received, in order.
enum WireMessagePart {
    case head(WireHead)
    /// Body bytes, framing removed (slices of the received buffers).
    case body(ByteBuffer)
    /// The message is complete; the trailers of a chunked body, if any were sent.
    case end(WireTrailers?)
}

extension ByteBuffer {
    /// Appends bytes just received to what is left unread: taken as they are when nothing is
    /// left (no copy), else copied behind it after the bytes already read are dropped. What is
    /// left unread is at most a partial head or framing line (the readers bound both), so the
    /// buffer never holds more than that plus one read — a connection that always leaves a
    /// byte behind must not keep everything it ever sent (found in review: memory and copying
    /// grew with every request).
    mutating func cumulate(_ received: ByteBuffer) {
        if readableBytes == 0 {
            self = received
        } else {
            discardReadBytes()
            var received = received
            writeBuffer(&received)
        }
    }
}
