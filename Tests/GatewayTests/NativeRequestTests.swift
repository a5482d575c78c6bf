import Foundation
import NIOCore
import NIOHTTP1
import Testing
@testable import Gateway

/// What `/_auth/native` reads from an app's body: the first-time name in each shape apps send.
@Suite("A native sign-in's body")
struct NativeRequestTests {
    static func read(_ json: String) throws(SignInFailure) -> NativeRequest {
        let head = HTTPRequestHead(version: .http1_1, method: .POST, uri: "/_auth/native", headers: ["content-type": "application/json"])
        return try NativeRequest(head: head, body: ByteBuffer(string: json))
    }

    @Test("the name: Apple's web user object, its JSON as a string, or the app's fullName (PersonNameComponents as JSONEncoder writes it)", arguments: [
        (#""user":{"name":{"firstName":"Ada","lastName":"Lovelace"}}"#, "Ada Lovelace" as String?),
        (#""user":"{\"name\":{\"firstName\":\"Ada\",\"lastName\":\"Lovelace\"}}""#, "Ada Lovelace"),
        (#""full_name":{"givenName":"Ada","familyName":"Lovelace"}"#, "Ada Lovelace"),
        (#""fullName":{"givenName":"Ada","middleName":"King","familyName":"Lovelace","nickname":"Countess"}"#, "Ada King Lovelace"),
        (#""user":{"name":{"givenName":"Ada","familyName":"Lovelace"}}"#, "Ada Lovelace"),
        (#""full_name":{"givenName":"Zoë\u0007"}"#, "Zoë"),
        (#""full_name":{}"#, nil),
        (#""full_name":"Ada Lovelace""#, nil),
        (#""nonce":"n""#, nil),
    ])
    func name(field: String, expected: String?) throws {
        let request = try Self.read(#"{"identity_token":"t","authorization_code":"c",\#(field)}"#)
        #expect(request.name == expected)
    }

    @Test("a person's JSONEncoder output reads as their name")
    func encodedComponents() throws {
        var person = PersonNameComponents()
        person.givenName = "Grace"
        person.familyName = "Hopper"
        let encoded = String(decoding: try JSONEncoder().encode(person), as: UTF8.self)
        let request = try Self.read(#"{"identity_token":"t","authorization_code":"c","full_name":\#(encoded)}"#)
        #expect(request.name == "Grace Hopper", "\(encoded)")
    }
}
