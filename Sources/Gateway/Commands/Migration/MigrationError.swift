/// Why a migration (or a transfer file) was refused, in words for the operator: the
/// configuration, the file's line, or Apple's refusal of our client.
public struct MigrationError: Error, CustomStringConvertible {
    public var description: String
    public init(_ description: String) { self.description = description }
}
