import NIOCore

/// A Redis reply (RESP2).
public enum RESPValue: Sendable, Equatable {
    case simpleString(String)
    case error(String)
    case integer(Int64)
    /// A bulk string; `nil` is Redis's null bulk reply. Read from the wire, it is a slice of the
    /// buffer the reply arrived in (no copy): take `string` or `bytes` from it rather than keep
    /// it, or it keeps that buffer.
    case bulkString(ByteBuffer?)
    /// An array; `nil` is the null array.
    case array([RESPValue]?)

    /// The value as text, for bulk and simple strings.
    public var string: String? {
        switch self {
        case .simpleString(let s): return s
        case .bulkString(let buffer?): return String(buffer: buffer)
        default: return nil
        }
    }

    /// A bulk string of these bytes.
    public static func bulkString(_ bytes: [UInt8]) -> RESPValue { .bulkString(ByteBuffer(bytes: bytes)) }

    /// The value's bytes (a copy), for bulk and simple strings.
    public var bytes: [UInt8]? {
        switch self {
        case .bulkString(let buffer): return buffer.map { Array($0.readableBytesView) }
        case .simpleString(let s): return Array(s.utf8)
        default: return nil
        }
    }

    public var int: Int64? {
        if case .integer(let n) = self { return n }
        return nil
    }

    public var isNull: Bool {
        switch self {
        case .bulkString(nil), .array(nil): return true
        default: return false
        }
    }
}

/// A command argument: text or raw bytes (binary safe).
public enum RedisArgument: Sendable, ExpressibleByStringLiteral {
    case string(String)
    case bytes([UInt8])

    public init(stringLiteral value: String) { self = .string(value) }
    public init(_ value: String) { self = .string(value) }
    public init(_ value: Int64) { self = .string(String(value)) }

    var utf8: [UInt8] {
        switch self {
        case .string(let s): return Array(s.utf8)
        case .bytes(let b): return b
        }
    }
}

/// RESP framing: commands are written straight into the outgoing buffer (an array of bulk
/// strings: no copy of an argument but the one into the buffer); `RESPReader` reads replies.
enum RESPCodec {
    /// Appends one command (binary safe) to `buffer`.
    static func encode(_ arguments: [RedisArgument], into buffer: inout ByteBuffer) {
        buffer.writeInteger(UInt8(ascii: "*"))
        buffer.writeString(String(arguments.count))
        buffer.writeStaticString("\r\n")
        for argument in arguments {
            buffer.writeInteger(UInt8(ascii: "$"))
            switch argument {
            case .string(let s):
                buffer.writeString(String(s.utf8.count))
                buffer.writeStaticString("\r\n")
                buffer.writeString(s)
            case .bytes(let b):
                buffer.writeString(String(b.count))
                buffer.writeStaticString("\r\n")
                buffer.writeBytes(b)
            }
            buffer.writeStaticString("\r\n")
        }
    }
}
