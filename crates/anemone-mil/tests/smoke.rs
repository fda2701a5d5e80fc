mod common;

#[test]
fn smoke_write_read() {
    let p = common::two_function_program();
    print!("{}", anemone_mil::print_program(&p));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.mlpackage");
    let s = anemone_mil::write_package(&p, &path, &Default::default()).unwrap();
    println!("{s:?}");
    let back = anemone_mil::read_package(&path).unwrap();
    assert_eq!(back, p);
    let c = common::conv_program();
    let path2 = dir.path().join("conv.mlpackage");
    anemone_mil::write_package(&c, &path2, &Default::default()).unwrap();
    assert_eq!(anemone_mil::read_package(&path2).unwrap(), c);
    std::fs::create_dir_all("/tmp/milref/ours").unwrap();
    let _ = std::fs::remove_dir_all("/tmp/milref/ours/kv.mlpackage");
    let _ = std::fs::remove_dir_all("/tmp/milref/ours/conv.mlpackage");
    anemone_mil::write_package(
        &p,
        "/tmp/milref/ours/kv.mlpackage".as_ref(),
        &Default::default(),
    )
    .unwrap();
    anemone_mil::write_package(
        &c,
        "/tmp/milref/ours/conv.mlpackage".as_ref(),
        &Default::default(),
    )
    .unwrap();
}
