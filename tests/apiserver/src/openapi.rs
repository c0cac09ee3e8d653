//! The OpenAPI v3 schemas of the served kinds, read off the k8s-openapi
//! types the server validates with (see `schema`), so they name the same
//! fields with the same types.
//!
//! A type's `Deserialize` is driven by a tracing deserializer: each struct
//! names its fields (`deserialize_struct`), each field's value asks for
//! what it is (a string, an `i32`, a list, another struct...), and the
//! special types name themselves (`Time`, `Quantity`, `IntOrString`...).
//! Which fields are required is read off the `Serialize` side: a
//! required field is written even when the value has none, an optional
//! one is not. Descriptions are short ones of our own for the fields
//! operators look up (`kubectl explain service.spec`), else none.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, Expected, IntoDeserializer, MapAccess,
    SeqAccess, Visitor,
};
use serde_json::{Map, Value, json};

type Error = de::value::Error;

/// What a value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Bool,
    Int32,
    Int64,
    Number,
    String,
    /// A base64-encoded string.
    Bytes,
    /// A type with a schema of its own: `Time`, `MicroTime`, `Quantity`,
    /// `IntOrString`, `FieldsV1`, `RawExtension`.
    Named(&'static str),
    /// Any JSON.
    Any,
    Array(Box<Shape>),
    Map(Box<Shape>),
    /// A struct, by its type's name.
    Struct(String),
}

impl Shape {
    /// Whether no struct is inside.
    fn is_leaf(&self) -> bool {
        match self {
            Self::Array(s) | Self::Map(s) => s.is_leaf(),
            Self::Struct(_) => false,
            _ => true,
        }
    }
}

/// The structs of a type and of everything it holds.
#[derive(Debug, Default)]
pub struct Types {
    /// Each struct's fields, as its type lists them.
    pub structs: BTreeMap<String, Vec<(String, Shape)>>,
    /// Each struct's required fields.
    pub required: BTreeMap<String, BTreeSet<String>>,
    /// Structs being traced (for recursive types).
    in_progress: BTreeSet<String>,
}

impl Types {
    fn field(&self, name: &str, field: &str) -> Option<Shape> {
        self.structs
            .get(name)?
            .iter()
            .find(|(f, _)| f == field)
            .map(|(_, s)| s.clone())
    }
}

/// The passes over a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pass {
    /// Learns every struct's fields: every optional value is present.
    Shapes,
    /// No optional value is present: only required fields are written.
    NoOptions,
    /// Only optional values with a struct inside are present: every
    /// struct is reached, and of its other fields only required ones are
    /// written.
    NoLeafOptions,
}

/// A timestamp `Time` and `MicroTime` accept.
const SOME_TIME: &str = "1970-01-01T00:00:00Z";

/// How deep passes after the first go (recursive types end there).
const MAX_DEPTH: usize = 40;

fn str_de(s: &'static str) -> de::value::StrDeserializer<'static, Error> {
    s.into_deserializer()
}

fn expecting<'de, V: Visitor<'de>>(v: &V) -> String {
    format!("{}", v as &dyn Expected)
}

/// Resource types other kinds embed whole, whose `Deserialize` checks
/// their `apiVersion` and `kind` as a resource's own does (a StatefulSet's
/// `volumeClaimTemplates`): `(kind, apiVersion)`.
const EMBEDDED_RESOURCES: &[(&str, &str)] = &[("PersistentVolumeClaim", "v1")];

#[derive(Clone)]
struct Tracer<'a> {
    types: &'a RefCell<Types>,
    pass: Pass,
    /// Where the first pass reports what this value is.
    slot: Option<&'a RefCell<Option<Shape>>>,
    /// What the first pass found this value to be (later passes).
    known: Option<Shape>,
    depth: usize,
    /// The `apiVersion` and `kind` a resource's own `Deserialize` checks.
    top: Option<(&'static str, &'static str)>,
}

impl<'a> Tracer<'a> {
    fn set(&self, shape: Shape) {
        if let Some(slot) = self.slot {
            *slot.borrow_mut() = Some(shape);
        }
    }

    fn child<'b>(
        &self,
        slot: Option<&'b RefCell<Option<Shape>>>,
        known: Option<Shape>,
    ) -> Tracer<'b>
    where
        'a: 'b,
    {
        Tracer {
            types: self.types,
            pass: self.pass,
            slot,
            known,
            depth: self.depth + 1,
            top: None,
        }
    }

    fn known_inner(&self) -> Option<Shape> {
        match &self.known {
            Some(Shape::Array(s) | Shape::Map(s)) => Some((**s).clone()),
            _ => None,
        }
    }
}

/// One element, for lists and maps.
struct One<'a> {
    item: Option<Tracer<'a>>,
    key_sent: bool,
}

impl<'de, 'a> SeqAccess<'de> for One<'a> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.item.take().map(|t| seed.deserialize(t)).transpose()
    }
}

impl<'de, 'a> MapAccess<'de> for One<'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if self.key_sent || self.item.is_none() {
            return Ok(None);
        }
        self.key_sent = true;
        seed.deserialize(str_de("key")).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let item = self
            .item
            .take()
            .ok_or_else(|| <Error as de::Error>::custom("no value"))?;
        seed.deserialize(item)
    }
}

/// No entries: a struct seen before, or one too deep.
struct Empty;

impl<'de> MapAccess<'de> for Empty {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, _: K) -> Result<Option<K::Value>, Error> {
        Ok(None)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("no value"))
    }
}

/// A struct's fields, one value each.
struct Fields<'a> {
    parent: Tracer<'a>,
    name: &'static str,
    fields: &'static [&'static str],
    next: usize,
    found: Vec<(String, Shape)>,
}

impl<'de, 'a> MapAccess<'de> for Fields<'a> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.fields.get(self.next) {
            Some(field) => seed.deserialize(str_de(field)).map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let field = self.fields[self.next];
        self.next += 1;
        let resource = self.parent.top.or_else(|| {
            EMBEDDED_RESOURCES
                .iter()
                .find(|(kind, _)| *kind == self.name)
                .map(|(kind, api_version)| (*api_version, *kind))
        });
        if let Some((api_version, kind)) = resource {
            let expected = match field {
                "apiVersion" => Some(api_version),
                "kind" => Some(kind),
                _ => None,
            };
            if let Some(value) = expected {
                self.found.push((field.to_owned(), Shape::String));
                return seed.deserialize(str_de(value));
            }
        }
        let known = self.parent.types.borrow().field(self.name, field);
        let slot = RefCell::new(None);
        let value = seed.deserialize(self.parent.child(Some(&slot), known))?;
        self.found
            .push((field.to_owned(), slot.into_inner().unwrap_or(Shape::Any)));
        Ok(value)
    }
}

impl<'de, 'a> Deserializer<'de> for Tracer<'a> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        if expecting(&v) == "IntOrString" {
            self.set(Shape::Named("IntOrString"));
            return v.visit_i32(0);
        }
        self.set(Shape::Any);
        v.visit_unit()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Bool);
        v.visit_bool(false)
    }

    fn deserialize_i8<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_i32(v)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_i32(v)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Int32);
        v.visit_i32(0)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Int64);
        v.visit_i64(0)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_u32(v)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_u32(v)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Int32);
        v.visit_u32(0)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Int64);
        v.visit_u64(0)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_f64(v)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Number);
        v.visit_f64(0.0)
    }

    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::String);
        v.visit_char('x')
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::String);
        v.visit_str("")
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_str(v)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Bytes);
        v.visit_bytes(&[])
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(v)
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.pass {
            // k8s-openapi's ByteString reads itself as an option.
            Pass::Shapes if expecting(&v) == "a base64-encoded string" => {
                self.set(Shape::Bytes);
                v.visit_none()
            }
            Pass::Shapes => v.visit_some(self),
            Pass::NoOptions => v.visit_none(),
            Pass::NoLeafOptions if self.known.as_ref().is_some_and(|s| !s.is_leaf()) => {
                v.visit_some(self)
            }
            Pass::NoLeafOptions => v.visit_none(),
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.set(Shape::Any);
        v.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        match name {
            "Time" | "MicroTime" => {
                self.set(Shape::Named(name));
                v.visit_newtype_struct(str_de(SOME_TIME))
            }
            "Quantity" => {
                self.set(Shape::Named(name));
                v.visit_newtype_struct(str_de("0"))
            }
            "FieldsV1" | "RawExtension" => {
                self.set(Shape::Named(name));
                let null: de::value::UnitDeserializer<Error> = ().into_deserializer();
                v.visit_newtype_struct(null)
            }
            _ => v.visit_newtype_struct(self),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let slot = RefCell::new(None);
        let item = self.child(Some(&slot), self.known_inner());
        let value = v.visit_seq(One {
            item: Some(item),
            key_sent: false,
        })?;
        self.set(Shape::Array(Box::new(
            slot.into_inner().unwrap_or(Shape::Any),
        )));
        Ok(value)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, v: V) -> Result<V::Value, Error> {
        self.deserialize_seq(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: usize,
        v: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let slot = RefCell::new(None);
        let item = self.child(Some(&slot), self.known_inner());
        let value = v.visit_map(One {
            item: Some(item),
            key_sent: false,
        })?;
        self.set(Shape::Map(Box::new(
            slot.into_inner().unwrap_or(Shape::Any),
        )));
        Ok(value)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        self.set(Shape::Struct(name.to_owned()));
        let seen = {
            let types = self.types.borrow();
            types.structs.contains_key(name) || types.in_progress.contains(name)
        };
        let first = self.pass == Pass::Shapes;
        if (first && seen) || self.depth > MAX_DEPTH {
            return v.visit_map(Empty);
        }
        if first {
            self.types.borrow_mut().in_progress.insert(name.to_owned());
        }
        let mut map = Fields {
            parent: self.clone(),
            name,
            fields,
            next: 0,
            found: Vec::new(),
        };
        let value = v.visit_map(&mut map)?;
        if first {
            let mut types = self.types.borrow_mut();
            types.in_progress.remove(name);
            types.structs.insert(name.to_owned(), map.found);
        }
        Ok(value)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        _: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Error> {
        Err(de::Error::custom(format!("enum {name} is not traced")))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_str("")
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }
}

/// The fields of every struct in `v` (of shape `shape`) that are written.
fn written(types: &Types, shape: &Shape, v: &Value, out: &mut BTreeMap<String, BTreeSet<String>>) {
    match (shape, v) {
        (Shape::Struct(name), Value::Object(o)) => {
            for (key, value) in o {
                out.entry(name.clone()).or_default().insert(key.clone());
                if let Some(field) = types.field(name, key) {
                    written(types, &field, value, out);
                }
            }
        }
        (Shape::Array(item), Value::Array(a)) => {
            for value in a {
                written(types, item, value, out);
            }
        }
        (Shape::Map(item), Value::Object(o)) => {
            for value in o.values() {
                written(types, item, value, out);
            }
        }
        _ => {}
    }
}

/// Traces the resource type `T`: its struct is named `T::KIND`.
pub fn trace<T>() -> Result<Types, String>
where
    T: DeserializeOwned + Serialize + k8s_openapi::Resource,
{
    let types = RefCell::new(Types::default());
    let run = |pass: Pass, slot: Option<&RefCell<Option<Shape>>>| {
        let known = (pass != Pass::Shapes).then(|| Shape::Struct(T::KIND.to_owned()));
        T::deserialize(Tracer {
            types: &types,
            pass,
            slot,
            known,
            depth: 0,
            top: Some((T::API_VERSION, T::KIND)),
        })
        .map_err(|e| format!("{}: {e}", T::KIND))
    };
    let slot = RefCell::new(None);
    run(Pass::Shapes, Some(&slot))?;
    let top = Shape::Struct(T::KIND.to_owned());
    let mut passes = Vec::new();
    for pass in [Pass::NoOptions, Pass::NoLeafOptions] {
        let value = serde_json::to_value(run(pass, None)?).map_err(|e| e.to_string())?;
        let mut seen = BTreeMap::new();
        written(&types.borrow(), &top, &value, &mut seen);
        passes.push(seen);
    }
    let mut types = types.into_inner();
    let mut required = BTreeMap::new();
    for (name, fields) in &types.structs {
        let is = |pass: usize, field: &str| {
            passes[pass]
                .get(name)
                .is_some_and(|fields| fields.contains(field))
        };
        let set: BTreeSet<String> = fields
            .iter()
            .filter(|(field, shape)| {
                // A required struct is written (empty) only when nothing
                // optional is; a required leaf whenever its struct is.
                if shape.is_leaf() {
                    is(1, field)
                } else {
                    is(0, field)
                }
            })
            .map(|(field, _)| field.clone())
            .filter(|field| {
                // Every object has these; Kubernetes' schemas do not list
                // them as required.
                !(name == T::KIND && matches!(field.as_str(), "apiVersion" | "kind" | "metadata"))
            })
            .collect();
        if !set.is_empty() {
            required.insert(name.clone(), set);
        }
    }
    types.required = required;
    Ok(types)
}

/// The package a type's schema is named in, as kube-apiserver names its
/// schemas (`io.k8s.api.core.v1.ServiceSpec`): the meta, resource and
/// util types are apimachinery's, the core types other groups use are
/// core's, the rest are of `group`.
fn package(name: &str, group: &str) -> &'static str {
    match name {
        "ObjectMeta"
        | "ManagedFieldsEntry"
        | "OwnerReference"
        | "Condition"
        | "ListMeta"
        | "LabelSelector"
        | "LabelSelectorRequirement"
        | "FieldSelectorRequirement"
        | "Time"
        | "MicroTime"
        | "FieldsV1" => "io.k8s.apimachinery.pkg.apis.meta.v1",
        "Quantity" => "io.k8s.apimachinery.pkg.api.resource",
        "IntOrString" => "io.k8s.apimachinery.pkg.util.intstr",
        "RawExtension" => "io.k8s.apimachinery.pkg.runtime",
        "ObjectReference" | "EventSource" => "io.k8s.api.core.v1",
        _ => match group {
            "events.k8s.io" => "io.k8s.api.events.v1",
            "coordination.k8s.io" => "io.k8s.api.coordination.v1",
            "certificates.k8s.io" => "io.k8s.api.certificates.v1",
            "authentication.k8s.io" => "io.k8s.api.authentication.v1",
            "authorization.k8s.io" => "io.k8s.api.authorization.v1",
            "apiregistration.k8s.io" => "io.k8s.kube-aggregator.pkg.apis.apiregistration.v1",
            _ => "io.k8s.api.core.v1",
        },
    }
}

/// The full name of the schema of `name` in the document of `group`.
pub fn schema_name(name: &str, group: &str) -> String {
    format!("{}.{name}", package(name, group))
}

fn reference(name: &str, group: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{}", schema_name(name, group))})
}

/// The schema of a value of `shape`; a struct, and the types with schemas
/// of their own, by reference, as kube-apiserver writes them (`allOf`
/// one `$ref`, so a description may sit beside it).
fn property(shape: &Shape, group: &str) -> Value {
    match shape {
        Shape::Bool => json!({"type": "boolean"}),
        Shape::Int32 => json!({"type": "integer", "format": "int32"}),
        Shape::Int64 => json!({"type": "integer", "format": "int64"}),
        Shape::Number => json!({"type": "number", "format": "double"}),
        Shape::String => json!({"type": "string"}),
        Shape::Bytes => json!({"type": "string", "format": "byte"}),
        Shape::Any => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        Shape::Named(name) => json!({"allOf": [reference(name, group)]}),
        Shape::Struct(name) => json!({"allOf": [reference(name, group)], "default": {}}),
        Shape::Array(item) => json!({"type": "array", "items": element(item, group)}),
        Shape::Map(item) => json!({"type": "object", "additionalProperties": element(item, group)}),
    }
}

/// A list's or map's element, with the default kube-apiserver gives it.
fn element(shape: &Shape, group: &str) -> Value {
    match shape {
        Shape::String => json!({"type": "string", "default": ""}),
        Shape::Named(name) => reference(name, group),
        other => property(other, group),
    }
}

/// The schemas of the types with schemas of their own.
fn named_schema(name: &str) -> Value {
    match name {
        "Time" => json!({"type": "string", "format": "date-time",
            "description": "A timestamp in RFC 3339 form, to the second."}),
        "MicroTime" => json!({"type": "string", "format": "date-time",
            "description": "A timestamp in RFC 3339 form, to the microsecond."}),
        "Quantity" => json!({"oneOf": [{"type": "string"}, {"type": "number"}],
            "description": "A fixed-point number with an optional suffix: 100m, 1Gi, 2."}),
        "IntOrString" => json!({"type": "string", "format": "int-or-string",
            "description": "An integer or a string: a port number or a port's name."}),
        _ => json!({"type": "object"}),
    }
}

/// The name and schema of a custom resource's kind (one without a type
/// here, see `resources::Resource::custom`), as kube-apiserver names a
/// CRD's (the group reversed: `io.k8s.storage.snapshot.v1.VolumeSnapshot`).
/// Only the fields every object has are described; the rest is kept as
/// written, so `kubectl explain` finds the kind and no field is refused.
pub fn custom_schema(group: &str, version: &str, kind: &str) -> (String, Value) {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    let name = format!("{}.{version}.{kind}", reversed.join("."));
    let field = |field: &str, schema: Value| {
        let mut schema = schema;
        if let Some(text) = description(kind, field, true) {
            schema["description"] = json!(text);
        }
        schema
    };
    let mut schema = json!({
        "type": "object",
        "properties": {
            "apiVersion": field("apiVersion", json!({"type": "string"})),
            "kind": field("kind", json!({"type": "string"})),
            "metadata": field("metadata", json!({"type": "object"})),
        },
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-group-version-kind": [{"group": group, "kind": kind, "version": version}],
    });
    if let Some(text) = type_description(kind, group) {
        schema["description"] = json!(text);
    }
    (name, schema)
}

/// The components of a group version's document, for the resources
/// `kinds` (each a kind and its types) of `group` and `version`.
pub fn components(group: &str, version: &str, kinds: &[(&str, &Types)]) -> Map<String, Value> {
    let mut out = Map::new();
    let mut named = BTreeSet::new();
    for (kind, types) in kinds {
        for (name, fields) in &types.structs {
            let full = schema_name(name, group);
            let mut properties = Map::new();
            for (field, shape) in fields {
                let mut p = property(shape, group);
                collect_named(shape, &mut named);
                if let Some(text) = description(name, field, name == kind) {
                    p["description"] = json!(text);
                }
                if let Some(values) = enumeration(name, field) {
                    p["enum"] = json!(values);
                }
                properties.insert(field.clone(), p);
            }
            let mut schema = json!({"type": "object", "properties": properties});
            if let Some(required) = types.required.get(name) {
                schema["required"] = json!(required);
            }
            if let Some(text) = type_description(name, group) {
                schema["description"] = json!(text);
            }
            if name == kind {
                schema["x-kubernetes-group-version-kind"] =
                    json!([{"group": group, "kind": kind, "version": version}]);
            }
            // A kind seen as another's part keeps its kind.
            match out.get_mut(&full) {
                Some(existing) if name == kind => {
                    existing["x-kubernetes-group-version-kind"] =
                        schema["x-kubernetes-group-version-kind"].clone();
                }
                Some(_) => {}
                None => {
                    out.insert(full, schema);
                }
            }
        }
    }
    for name in named {
        out.insert(schema_name(name, group), named_schema(name));
    }
    out
}

fn collect_named(shape: &Shape, out: &mut BTreeSet<&'static str>) {
    match shape {
        Shape::Named(name) => {
            out.insert(name);
        }
        Shape::Array(s) | Shape::Map(s) => collect_named(s, out),
        _ => {}
    }
}

/// The values a field takes, where Kubernetes' schema lists them.
fn enumeration(name: &str, field: &str) -> Option<&'static [&'static str]> {
    Some(match (name, field) {
        ("ServiceSpec", "type") => &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ("ServiceSpec", "externalTrafficPolicy" | "internalTrafficPolicy") => &["Cluster", "Local"],
        ("ServiceSpec", "sessionAffinity") => &["ClientIP", "None"],
        ("ServiceSpec", "ipFamilyPolicy") => {
            &["PreferDualStack", "RequireDualStack", "SingleStack"]
        }
        ("ServicePort" | "EndpointPort" | "ContainerPort" | "PortStatus", "protocol") => {
            &["SCTP", "TCP", "UDP"]
        }
        ("Taint", "effect") => &["NoExecute", "NoSchedule", "PreferNoSchedule"],
        _ => return None,
    })
}

/// A type's description, for the kinds and the parts operators look up.
fn type_description(name: &str, group: &str) -> Option<&'static str> {
    Some(match (name, group) {
        ("Service", _) => {
            "A stable name and address for a set of pods (chosen by a selector) or an external name, and how it is reached: inside the cluster, on a port of every node, or through a cloud load balancer."
        }
        ("ServiceSpec", _) => "What a Service exposes, and how.",
        ("ServicePort", _) => "One port a Service exposes.",
        ("ServiceStatus", _) => {
            "What the cluster observed of a Service: its load balancer's ingress points and its conditions."
        }
        ("LoadBalancerIngress", _) => {
            "Where a load balancer receives traffic: an IP or a hostname."
        }
        ("Node", _) => "A machine that runs pods, as its kubelet registered it.",
        ("NodeSpec", _) => {
            "How a node is to be used: its pod CIDRs, its cloud provider ID, its taints, and whether it takes new pods."
        }
        ("NodeStatus", _) => "What the kubelet and the cloud report of a node.",
        ("Taint", _) => {
            "Keeps pods that do not tolerate it off the node (NoSchedule, PreferNoSchedule), or evicts them (NoExecute)."
        }
        ("Lease", _) => {
            "Who holds a lease, and until when: leader election and node heartbeats use them."
        }
        ("LeaseSpec", _) => "Who holds the lease, since when and for how long.",
        ("Pod", _) => "A group of containers that run together on a node.",
        ("Namespace", _) => "A scope for the names of namespaced objects.",
        ("Endpoints", _) => "The addresses and ports that back a Service.",
        ("EndpointSlice", _) => {
            "Some of the endpoints that back a Service, with the node each runs on and whether it is ready."
        }
        ("Event", "") => {
            "A report of something that happened to an object (core/v1 view; see events.k8s.io for the newer form)."
        }
        ("Event", _) => "A report of something that happened to an object.",
        ("CertificateSigningRequest", _) => {
            "A request for a certificate, approved or denied, and then signed by a signer."
        }
        ("TokenReview", _) => "Asks who a bearer token authenticates.",
        ("SubjectAccessReview", _) => "Asks whether a user or groups may do something.",
        ("LocalSubjectAccessReview", _) => {
            "Asks whether a user or groups may do something in one namespace."
        }
        ("SelfSubjectAccessReview", _) => "Asks whether the caller may do something.",
        ("SelfSubjectRulesReview", _) => "Asks what the caller may do in a namespace.",
        ("VolumeSnapshot", "snapshot.storage.k8s.io") => {
            "A user's request for a point-in-time snapshot of a PersistentVolumeClaim's volume, or to use an existing snapshot (a VolumeSnapshotContent)."
        }
        ("VolumeSnapshotContent", "snapshot.storage.k8s.io") => {
            "A snapshot on the storage system, taken through its CSI driver, and the VolumeSnapshot it is bound to."
        }
        ("VolumeSnapshotClass", "snapshot.storage.k8s.io") => {
            "How snapshots are taken: the CSI driver, its parameters, and whether a snapshot is deleted or retained with its VolumeSnapshot."
        }
        _ => return None,
    })
}

/// A field's description, for the fields of every object and the fields
/// operators look up.
fn description(name: &str, field: &str, top: bool) -> Option<&'static str> {
    if top {
        match field {
            "apiVersion" => {
                return Some(
                    "The versioned schema of this representation of the object: group/version.",
                );
            }
            "kind" => return Some("The kind of object this is."),
            "metadata" => {
                return Some(
                    "Standard object metadata: name, namespace, labels and annotations, and what the server sets.",
                );
            }
            "spec" => return Some("The desired state."),
            "status" => return Some("The observed state, written by the system."),
            _ => {}
        }
    }
    Some(match (name, field) {
        ("ServiceSpec", "allocateLoadBalancerNodePorts") => {
            "Whether node ports are allocated for a LoadBalancer Service (true by default). Load balancers that send traffic straight to pods may turn this off. Only for LoadBalancer Services."
        }
        ("ServiceSpec", "clusterIP") => {
            "The Service's virtual IP inside the cluster, allocated unless given; \"None\" makes a headless Service. Cannot change, except to or from type ExternalName."
        }
        ("ServiceSpec", "clusterIPs") => {
            "The Service's cluster IPs, one per IP family; the first is clusterIP."
        }
        ("ServiceSpec", "externalIPs") => {
            "IPs not managed by the cluster on which nodes also accept this Service's traffic."
        }
        ("ServiceSpec", "externalName") => {
            "The DNS name an ExternalName Service is an alias (CNAME) for."
        }
        ("ServiceSpec", "externalTrafficPolicy") => {
            "How traffic from outside the cluster reaches endpoints: \"Cluster\" spreads it over all ready endpoints; \"Local\" keeps it on the node it arrived at and keeps the client's address. Only for NodePort and LoadBalancer Services."
        }
        ("ServiceSpec", "healthCheckNodePort") => {
            "The node port on which a LoadBalancer Service with externalTrafficPolicy \"Local\" answers its load balancer's health checks; allocated unless given."
        }
        ("ServiceSpec", "internalTrafficPolicy") => {
            "How traffic from inside the cluster reaches endpoints: \"Cluster\" or \"Local\"."
        }
        ("ServiceSpec", "ipFamilies") => {
            "The IP families (IPv4, IPv6) of the Service's cluster IPs."
        }
        ("ServiceSpec", "ipFamilyPolicy") => "SingleStack, PreferDualStack or RequireDualStack.",
        ("ServiceSpec", "loadBalancerClass") => {
            "The load balancer implementation this Service belongs to; a cloud controller leaves Services of other classes alone. Only for LoadBalancer Services; cannot change once set."
        }
        ("ServiceSpec", "loadBalancerIP") => {
            "Deprecated: the IP the load balancer should take, where its implementation supports it."
        }
        ("ServiceSpec", "loadBalancerSourceRanges") => {
            "The client CIDRs the load balancer admits; all when empty."
        }
        ("ServiceSpec", "ports") => "The ports the Service exposes.",
        ("ServiceSpec", "publishNotReadyAddresses") => {
            "Whether the Service's endpoints include pods that are not ready."
        }
        ("ServiceSpec", "selector") => {
            "Sends traffic to the pods whose labels match. Without it, endpoints are managed by hand."
        }
        ("ServiceSpec", "sessionAffinity") => {
            "\"ClientIP\" keeps each client on one endpoint; \"None\" (the default) does not."
        }
        ("ServiceSpec", "sessionAffinityConfig") => "Settings of session affinity.",
        ("ServiceSpec", "trafficDistribution") => {
            "How traffic should be spread over endpoints: PreferClose prefers nearby ones."
        }
        ("ServiceSpec", "type") => {
            "How the Service is reached: ClusterIP (inside the cluster, the default), NodePort (also on a port of every node), LoadBalancer (also through a load balancer the cloud provides), or ExternalName (a DNS alias). Changing it away from NodePort and LoadBalancer clears the node ports, health check node port, load balancer class and traffic policy the request did not change."
        }
        ("ServicePort", "appProtocol") => "The application protocol of this port: a hint.",
        ("ServicePort", "name") => {
            "The port's name, unique in the Service; required when it has several ports."
        }
        ("ServicePort", "nodePort") => {
            "The port on every node that forwards to this port, for NodePort and LoadBalancer Services; allocated unless given."
        }
        ("ServicePort", "port") => "The port the Service listens on.",
        ("ServicePort", "protocol") => "TCP (the default), UDP or SCTP.",
        ("ServicePort", "targetPort") => {
            "The port, or a named port, on the pods; the same as port unless given."
        }
        ("ServiceStatus", "loadBalancer") => "The load balancer, once there is one.",
        ("ServiceStatus", "conditions") => "The Service's current conditions.",
        ("LoadBalancerStatus", "ingress") => "Where the load balancer receives traffic.",
        ("LoadBalancerIngress", "ip") => "The load balancer's IP.",
        ("LoadBalancerIngress", "hostname") => "The load balancer's DNS name.",
        ("LoadBalancerIngress", "ipMode") => {
            "VIP (traffic arrives with the load balancer's IP as its destination) or Proxy."
        }
        ("LoadBalancerIngress", "ports") => "The load balancer's ports, where it reports them.",
        ("NodeSpec", "configSource") => "Deprecated: where the kubelet's configuration comes from.",
        ("NodeSpec", "externalID") => "Deprecated.",
        ("NodeSpec", "podCIDR") => "The IP range of the node's pods.",
        ("NodeSpec", "podCIDRs") => "The IP ranges of the node's pods, one per IP family.",
        ("NodeSpec", "providerID") => {
            "The node's ID at its cloud provider: <provider>://<id>. The cloud controller sets it."
        }
        ("NodeSpec", "taints") => "The node's taints: which pods it repels.",
        ("NodeSpec", "unschedulable") => "Whether new pods are kept off the node (cordoned).",
        ("Taint", "effect") => "What the taint does to pods that do not tolerate it.",
        ("Taint", "key") => "The taint's key.",
        ("Taint", "timeAdded") => "When a NoExecute taint was added.",
        ("Taint", "value") => "The taint's value.",
        ("LeaseSpec", "acquireTime") => "When the current holder took the lease.",
        ("LeaseSpec", "holderIdentity") => "Who holds the lease.",
        ("LeaseSpec", "leaseDurationSeconds") => {
            "How long others wait after the last renewal before they may take the lease."
        }
        ("LeaseSpec", "leaseTransitions") => "How many times the lease changed holders.",
        ("LeaseSpec", "preferredHolder") => "Who should hold the lease next.",
        ("LeaseSpec", "renewTime") => "When the holder last renewed the lease.",
        ("LeaseSpec", "strategy") => "How the next holder is chosen.",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_is_traced_with_its_fields_their_types_and_what_is_required() {
        let types = trace::<k8s_openapi::api::core::v1::Service>().unwrap();
        let field = |s: &str, f: &str| types.field(s, f);
        assert_eq!(
            field("Service", "spec"),
            Some(Shape::Struct("ServiceSpec".into()))
        );
        assert_eq!(field("ServiceSpec", "type"), Some(Shape::String));
        assert_eq!(
            field("ServiceSpec", "ports"),
            Some(Shape::Array(Box::new(Shape::Struct("ServicePort".into()))))
        );
        assert_eq!(
            field("ServiceSpec", "selector"),
            Some(Shape::Map(Box::new(Shape::String)))
        );
        assert_eq!(
            field("ServiceSpec", "allocateLoadBalancerNodePorts"),
            Some(Shape::Bool)
        );
        assert_eq!(field("ServicePort", "port"), Some(Shape::Int32));
        assert_eq!(
            field("ServicePort", "targetPort"),
            Some(Shape::Named("IntOrString"))
        );
        assert_eq!(
            field("ObjectMeta", "creationTimestamp"),
            Some(Shape::Named("Time"))
        );
        assert_eq!(
            types.required.get("ServicePort"),
            Some(&BTreeSet::from(["port".to_owned()]))
        );
        assert!(!types.required.contains_key("Service"));
        assert!(!types.required.contains_key("ServiceSpec"));
    }

    #[test]
    fn required_structs_and_lists_are_found_too() {
        let types = trace::<k8s_openapi::api::core::v1::Event>().unwrap();
        assert_eq!(
            types.required.get("Event"),
            Some(&BTreeSet::from(["involvedObject".to_owned()]))
        );
        let types = trace::<k8s_openapi::api::core::v1::Node>().unwrap();
        assert_eq!(
            types.required.get("Taint"),
            Some(&BTreeSet::from(["effect".to_owned(), "key".to_owned()]))
        );
        let types =
            trace::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>().unwrap();
        assert_eq!(
            types.field("CertificateSigningRequestSpec", "request"),
            Some(Shape::Bytes)
        );
        assert!(types.required["CertificateSigningRequest"].contains("spec"));
        assert!(types.required["CertificateSigningRequestSpec"].contains("request"));
    }
}
